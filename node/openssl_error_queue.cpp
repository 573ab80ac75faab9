#include "node/openssl_error_queue.hpp"

#include <dlfcn.h>

#include <cstdlib>

#include <openssl/err.h>
#include <openssl/ssl.h>

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

}  // namespace

}  // namespace troupe

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto real = troupe::openssl_function<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto real = troupe::openssl_function<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_connect(SSL* ssl) {
  static const auto real = troupe::openssl_function<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return real(ssl);
}

int SSL_accept(SSL* ssl) {
  static const auto real = troupe::openssl_function<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return real(ssl);
}

int SSL_do_handshake(SSL* ssl) {
  static const auto real = troupe::openssl_function<int (*)(SSL*)>("SSL_do_handshake");
  ERR_clear_error();
  return real(ssl);
}

}  // extern "C"
