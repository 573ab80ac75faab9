#pragma once
// The cluster's credentials: a private certificate authority and one certificate per member
// (node, controller, admin client). Members authenticate each other with mutual TLS through
// CAF's OpenSSL module: a peer is accepted only when its certificate chains to the cluster's CA,
// so nothing joins without a certificate the CA's holder issued. `troupe certs` writes them.
//
// Files in a credentials directory (PEM):
//   ca.crt           the CA certificate: every member trusts it (copy it to every machine)
//   ca.key           the CA's private key: needed only to issue certificates; keep it off the nodes
//   NAME.crt/.key    a member's certificate (signed by the CA, subject CN=NAME) and private key

#include <filesystem>
#include <string>
#include <string_view>

namespace troupe {

struct member_credentials {
  std::filesystem::path certificate;
  std::filesystem::path private_key;
  std::filesystem::path ca_certificate;
};

// The files of member `name` in `dir` (which need not exist yet).
member_credentials credentials_in(const std::filesystem::path& dir, std::string_view name);

// Writes ca.crt and ca.key into `dir` (created if missing). Refuses to overwrite an existing CA:
// every certificate it issued would stop working. Throws std::runtime_error naming the problem.
void make_cluster_ca(const std::filesystem::path& dir, std::string_view cluster_name, int valid_days);

// Issues NAME.crt/NAME.key in `dir`, signed by the CA there, for TLS client and server use. A
// name is 1 to 64 of [A-Za-z0-9._-]. Refuses to overwrite an existing member unless `replace`.
member_credentials issue_member_certificate(const std::filesystem::path& dir, std::string_view name, int valid_days,
                                            bool replace = false);

// Checks, before any connection is made, that the member's files exist, that the key belongs to
// the certificate, and that the certificate chains to the CA and is valid now; throws naming what
// is wrong ("node1.crt is not signed by ca.crt", "node1.crt expired on ...").
void verify_member_credentials(const member_credentials& credentials);

// The subject's common name of a PEM certificate file (for logs: which member connected).
std::string certificate_common_name(const std::filesystem::path& certificate);

}  // namespace troupe
