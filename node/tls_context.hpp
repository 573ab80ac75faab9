#pragma once
// The TLS settings of one member, loaded once: its certificate and key, the cluster's CA as the
// only trust anchor, a certificate required from every peer (mutual TLS), TLS 1.2 at least.
//
// CAF's OpenSSL module built a new context for every connection, reading the three files from
// disk each time. At the open-files limit that read fails, and CAF throws from the multiplexer's
// thread: a flood of 1,100 plain TCP connections aborted a node ("cannot load certificate"),
// and the whole cluster when it was the controller (issue 25). Loaded once, a context costs no
// descriptor per connection, and a connection that cannot get a session is only refused.

#include <openssl/ssl.h>

#include "node/cluster_credentials.hpp"

namespace troupe {

class tls_context {
 public:
  // Throws std::runtime_error naming the file OpenSSL could not use and its reason.
  explicit tls_context(const member_credentials& files);
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;

  // A session over `fd`, accepting or connecting; nullptr when OpenSSL has no memory for one.
  SSL* new_session(int fd, bool accepting) const;

 private:
  SSL_CTX* ctx_ = nullptr;
};

}  // namespace troupe
