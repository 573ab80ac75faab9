#include "node/openssl_io_hooks.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <spdlog/spdlog.h>

namespace troupe {

void keep_openssl_error_queue_clean() {}

namespace {

// OpenSSL's own definition of `name`, found past this program in the lookup order.
template <class F>
F openssl_function(const char* name) {
  void* found = dlsym(RTLD_NEXT, name);
  if (!found) std::abort();  // libssl is linked: it cannot be missing
  return reinterpret_cast<F>(found);
}

std::string peer_of(SSL* ssl) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(SSL_get_fd(ssl), reinterpret_cast<sockaddr*>(&address), &length) != 0) return "a peer";
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  } else {
    return "a peer";
  }
  return std::string(host) + ":" + std::to_string(port);
}

// Marks a connection whose refusal was logged (CAF may call once more before it closes it).
int logged_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

// Runs one OpenSSL call; a handshake that fails for a TLS reason (a certificate the CA did not
// issue, or the peer refusing ours) is logged once. The peer's address is read before the call:
// a peer that refused us may have reset the socket by the time the call returns.
template <class Call>
int watch_handshake(SSL* ssl, Call call) {
  if (SSL_is_init_finished(ssl)) return call();
  const std::string peer = peer_of(ssl);
  const int ret = call();
  if (ret > 0 || SSL_get_error(ssl, ret) != SSL_ERROR_SSL || SSL_get_ex_data(ssl, logged_index())) return ret;
  SSL_set_ex_data(ssl, logged_index(), ssl);
  // ERR_peek: the queue stays as OpenSSL left it for CAF's own SSL_get_error.
  const unsigned long error = ERR_peek_error();
  char reason[256] = "unknown reason";
  if (error != 0) ERR_error_string_n(error, reason, sizeof(reason));
  spdlog::warn("TLS handshake with {} refused: {} ({} side)", peer, reason,
               SSL_is_server(ssl) ? "accepting" : "connecting");
  return ret;
}

}  // namespace

}  // namespace troupe

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto real = troupe::openssl_function<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return troupe::watch_handshake(ssl, [&] { return real(ssl, buf, num); });
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto real = troupe::openssl_function<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return troupe::watch_handshake(ssl, [&] { return real(ssl, buf, num); });
}

int SSL_connect(SSL* ssl) {
  static const auto real = troupe::openssl_function<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return troupe::watch_handshake(ssl, [&] { return real(ssl); });
}

int SSL_accept(SSL* ssl) {
  static const auto real = troupe::openssl_function<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return troupe::watch_handshake(ssl, [&] { return real(ssl); });
}

int SSL_do_handshake(SSL* ssl) {
  static const auto real = troupe::openssl_function<int (*)(SSL*)>("SSL_do_handshake");
  ERR_clear_error();
  return troupe::watch_handshake(ssl, [&] { return real(ssl); });
}

}  // extern "C"
