#include "node/tls_connection.hpp"

#include <cerrno>
#include <optional>
#include <utility>

#include <caf/io/network/stream_impl.hpp>
#include <caf/io/receive_policy.hpp>
#include <openssl/err.h>

namespace troupe {

using caf::io::network::rw_state;

namespace {

// The OpenSSL session of one connection; runs on the multiplexer's thread only.
class tls_session {
 public:
  tls_session(SSL* ssl, bool accepting, std::string peer, tls_connection_bounds bounds)
      : ssl_(ssl), accepting_(accepting), peer_(std::move(peer)), bounds_(std::move(bounds)) {}
  ~tls_session() {
    forget();
    SSL_free(ssl_);
  }

  // The connection leaves its guard; called before its socket is closed, so that the guard never
  // shuts down a descriptor that was closed and perhaps reused.
  void forget() {
    if (forgotten_) return;
    forgotten_ = true;
    bounds_.guard->closed(bounds_.ticket);
  }

  rw_state read_some(size_t& result, void* buf, size_t len) {
    result = 0;
    if (refused_) return rw_state::failure;
    if (const auto state = handshake(len, false)) return *state;
    const int n = SSL_read(ssl_, buf, static_cast<int>(len));
    if (n > 0) {
      result = static_cast<size_t>(n);
      return rw_state::success;
    }
    return waiting(n) ? rw_state::success : rw_state::failure;
  }

  rw_state write_some(size_t& result, const void* buf, size_t len) {
    result = 0;
    if (refused_) return rw_state::failure;
    if (const auto state = handshake(len, true)) return *state;
    const int n = SSL_write(ssl_, buf, static_cast<int>(len));
    if (n > 0) {
      result = static_cast<size_t>(n);
      return rw_state::success;
    }
    return waiting(n) ? rw_state::success : rw_state::failure;
  }

  bool must_read_more(size_t threshold) const { return static_cast<size_t>(SSL_pending(ssl_)) >= threshold; }

  // The peer's first bytes of CAF's protocol arrived: its handshake is over.
  void on_data() {
    if (established_) return;
    established_ = true;
    bounds_.guard->established(bounds_.ticket);
  }

  // Refuses a payload size over the bound: the next read fails, and the socket is shut down so
  // that a next read comes even when the peer sends nothing more.
  bool admit_read_size(size_t bytes) {
    if (bytes <= bounds_.max_message_bytes) return true;
    refused_ = true;
    const std::string kind = "a CAF message over " + std::to_string(bounds_.max_message_bytes) + " bytes";
    bounds_.guard->refuse(bounds_.ticket, kind,
                          "the member at " + peer_ + " announced a CAF message of " + std::to_string(bytes) +
                              " bytes, over the bound of " + std::to_string(bounds_.max_message_bytes) +
                              " ([cluster] max_message_mb): connection closed");
    return false;
  }

 private:
  // Drives the handshake while it is not done. Empty once it is (the call goes on to read or
  // write); else the state to report: waiting (success, nothing moved), or failure.
  std::optional<rw_state> handshake(size_t len, bool writing) {
    ERR_clear_error();  // OpenSSL wants the queue empty before each call (CAF never emptied it)
    if (handshake_done_) {
      if (len == 0) return rw_state::indeterminate;
      return std::nullopt;
    }
    const int rc = SSL_do_handshake(ssl_);
    if (rc == 1) {
      handshake_done_ = true;
      if (len == 0) return rw_state::indeterminate;
      return std::nullopt;
    }
    const int error = SSL_get_error(ssl_, rc);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
      // CAF's "nothing to write" must end a write event that only drove the handshake.
      return writing && len == 0 && error == SSL_ERROR_WANT_READ ? rw_state::indeterminate : rw_state::success;
    }
    log_refusal(error);
    return rw_state::failure;
  }

  bool waiting(int rc) const {
    const int error = SSL_get_error(ssl_, rc);
    return error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE;
  }

  void log_refusal(int error) {
    if (logged_) return;
    logged_ = true;
    const char* side = accepting_ ? "accepting side" : "connecting side";
    if (error == SSL_ERROR_SSL) {
      // ERR_peek: the first error is OpenSSL's reason ("certificate verify failed", "tlsv1
      // alert unknown ca").
      char reason[256] = "unknown reason";
      if (const unsigned long e = ERR_peek_error(); e != 0) ERR_error_string_n(e, reason, sizeof(reason));
      bounds_.guard->log().refuse(std::string("TLS handshake refused: ") + reason,
                                  "TLS handshake with " + peer_ + " refused: " + reason + " (" + side + ")");
      return;
    }
    bounds_.guard->log().refuse(
        "closed during the TLS handshake",
        "TLS handshake with " + peer_ + " refused: the peer closed the connection (" + side + ")");
  }

  SSL* ssl_;
  const bool accepting_;
  const std::string peer_;
  tls_connection_bounds bounds_;
  bool handshake_done_ = false;
  bool established_ = false;
  bool refused_ = false;
  bool logged_ = false;
  bool forgotten_ = false;
};

// CAF's stream calls its policy for every read and write; this one goes through the session.
struct tls_policy {
  explicit tls_policy(std::shared_ptr<tls_session> session) : session(std::move(session)) {}
  rw_state read_some(size_t& result, caf::io::network::native_socket, void* buf, size_t len) {
    return session->read_some(result, buf, len);
  }
  rw_state write_some(size_t& result, caf::io::network::native_socket, const void* buf, size_t len) {
    return session->write_some(result, buf, len);
  }
  bool must_read_more(caf::io::network::native_socket, size_t threshold) { return session->must_read_more(threshold); }
  std::shared_ptr<tls_session> session;
};

// As CAF's own scribes: a stream over the socket, started on the first configure_read.
class tls_scribe : public caf::io::scribe {
 public:
  tls_scribe(caf::io::network::default_multiplexer& mpx, int fd, std::shared_ptr<tls_session> session)
      : caf::io::scribe(caf::io::network::conn_hdl_from_socket(fd)), session_(session), stream_(mpx, fd, session) {}
  // The stream (a member) closes the socket after this body: the guard lets go of it first.
  ~tls_scribe() override { session_->forget(); }

  void configure_read(caf::io::receive_policy::config config) override {
    if (session_->admit_read_size(config.second)) {
      stream_.configure_read(config);
    } else {
      stream_.configure_read(caf::io::receive_policy::at_most(1));  // no buffer of the announced size
    }
    if (!launched_) launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = caf::io::network::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  uint16_t port() const override {
    auto x = caf::io::network::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }
  bool consume(caf::execution_unit* ctx, const void* buf, size_t num_bytes) override {
    session_->on_data();
    return caf::io::scribe::consume(ctx, buf, num_bytes);
  }

 private:
  void launch() {
    launched_ = true;
    stream_.start(this);
    // A write event drives the handshake's first flight (the connecting side speaks first).
    stream_.force_empty_write(this);
  }

  std::shared_ptr<tls_session> session_;
  caf::io::network::stream_impl<tls_policy> stream_;
  bool launched_ = false;
};

}  // namespace

caf::io::scribe_ptr make_tls_scribe(caf::io::network::default_multiplexer& mpx, int fd, const tls_context& context,
                                    bool accepting, tls_connection_bounds bounds) {
  SSL* ssl = context.new_session(fd, accepting);
  if (!ssl) {
    bounds.guard->log().refuse("no TLS session", "no TLS session for " + peer_address(fd) + " (out of memory)");
    bounds.guard->closed(bounds.ticket);
    return nullptr;
  }
  auto session = std::make_shared<tls_session>(ssl, accepting, peer_address(fd), std::move(bounds));
  return caf::make_counted<tls_scribe>(mpx, fd, std::move(session));
}

}  // namespace troupe
