#include "node/tls_context.hpp"

#include <stdexcept>
#include <string>

#include <openssl/err.h>

namespace troupe {

namespace {

std::string openssl_reason() {
  const unsigned long error = ERR_get_error();
  ERR_clear_error();
  if (error == 0) return "unknown reason";
  char text[256] = {};
  ERR_error_string_n(error, text, sizeof text);
  return text;
}

}  // namespace

tls_context::tls_context(const member_credentials& files) {
  ERR_clear_error();
  ctx_ = SSL_CTX_new(TLS_method());
  if (!ctx_) throw std::runtime_error("TLS: cannot create a context: " + openssl_reason());
  auto fail = [&](const std::string& what) {
    const std::string reason = openssl_reason();
    SSL_CTX_free(ctx_);
    ctx_ = nullptr;
    throw std::runtime_error("TLS: " + what + ": " + reason);
  };
  if (SSL_CTX_set_min_proto_version(ctx_, TLS1_2_VERSION) != 1) fail("cannot require TLS 1.2");
  if (SSL_CTX_use_certificate_chain_file(ctx_, files.certificate.c_str()) != 1) {
    fail("cannot load the certificate " + files.certificate.string());
  }
  if (SSL_CTX_use_PrivateKey_file(ctx_, files.private_key.c_str(), SSL_FILETYPE_PEM) != 1) {
    fail("cannot load the private key " + files.private_key.string());
  }
  if (SSL_CTX_check_private_key(ctx_) != 1) fail(files.private_key.string() + " does not belong to the certificate");
  if (SSL_CTX_load_verify_locations(ctx_, files.ca_certificate.c_str(), nullptr) != 1) {
    fail("cannot load the CA certificate " + files.ca_certificate.string());
  }
  SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  if (SSL_CTX_set_cipher_list(ctx_, "HIGH:!aNULL:!MD5") != 1) fail("cannot set the cipher list");
  // CAF's stream hands over its write buffer at an offset that moves as bytes leave: partial
  // writes are what it expects, and a retried write may come from a buffer that moved.
  SSL_CTX_set_mode(ctx_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
}

tls_context::~tls_context() { SSL_CTX_free(ctx_); }

SSL* tls_context::new_session(int fd, bool accepting) const {
  SSL* ssl = SSL_new(ctx_);
  if (!ssl) return nullptr;
  if (SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return nullptr;
  }
  if (accepting) {
    SSL_set_accept_state(ssl);
  } else {
    SSL_set_connect_state(ssl);
  }
  return ssl;
}

}  // namespace troupe
