#include "node/tls_doorman.hpp"

#include <unistd.h>

#include <caf/io/network/acceptor_impl.hpp>

#include "net/bounded_accept.hpp"
#include "node/tls_connection.hpp"

namespace troupe {

namespace {

// How CAF's acceptor takes a connection from the listening socket.
struct bounded_accept_policy {
  explicit bounded_accept_policy(refusal_log* log) : log(log) {}
  bool try_accept(caf::io::network::native_socket& result, caf::io::network::native_socket listener) {
    std::string shed;
    const int fd = accept_connection(listener, shed);
    if (!shed.empty()) log->refuse("out of file descriptors", shed);
    result = fd >= 0 ? fd : caf::io::network::invalid_native_socket;
    return true;  // nothing accepted: the acceptor waits for the next event
  }
  refusal_log* log;
};

class tls_doorman : public caf::io::doorman {
 public:
  tls_doorman(caf::io::network::default_multiplexer& mpx, int fd, tls_listener_settings settings)
      : caf::io::doorman(caf::io::network::accept_hdl_from_socket(fd)),
        settings_(std::move(settings)),
        acceptor_(mpx, fd, &settings_.guard->log()) {}

  bool new_connection() override {
    if (detached()) return false;  // the broker let go of this doorman; the multiplexer has not yet
    auto& mpx = acceptor_.backend();
    const int fd = acceptor_.accepted_socket();
    const uint64_t ticket = settings_.guard->admit(fd, peer_address(fd));
    if (ticket == 0) {
      ::close(fd);
      return false;
    }
    tls_connection_bounds bounds{settings_.guard, ticket, settings_.max_message_bytes};
    caf::io::scribe_ptr scribe = make_tls_scribe(mpx, fd, *settings_.context, true, std::move(bounds));
    if (!scribe) {
      ::close(fd);
      return false;
    }
    const auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return caf::io::doorman::new_connection(&mpx, hdl);
  }

  void graceful_shutdown() override {
    acceptor_.graceful_shutdown();
    detach(&acceptor_.backend(), false);
  }
  void launch() override { acceptor_.start(this); }
  std::string addr() const override {
    auto x = caf::io::network::local_addr_of_fd(acceptor_.fd());
    return x ? *x : std::string();
  }
  uint16_t port() const override {
    auto x = caf::io::network::local_port_of_fd(acceptor_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { acceptor_.activate(this); }
  void remove_from_loop() override { acceptor_.passivate(); }

 private:
  tls_listener_settings settings_;
  caf::io::network::acceptor_impl<bounded_accept_policy> acceptor_;
};

}  // namespace

caf::io::doorman_ptr make_tls_doorman(caf::io::network::default_multiplexer& mpx, int fd,
                                      tls_listener_settings settings) {
  reserve_spare_descriptor();
  return caf::make_counted<tls_doorman>(mpx, fd, std::move(settings));
}

}  // namespace troupe
