#pragma once
// Issuing a cluster member, as `troupe certs` does for each --name and `troupe launch` does for a
// local launch's private CA: its TLS certificate and key signed by the CA in the directory
// (node/cluster_credentials.hpp), checked, and its CURVE key pair for the KV data plane (the KV
// data plane authenticates with CURVE, not TLS).

#include <filesystem>
#include <string_view>

#include "node/cluster_credentials.hpp"

namespace troupe {

// NAME.crt/.key and NAME.kv.key/.kv.pub in `dir`, whose CA must exist. Refuses to overwrite an
// existing member unless `replace`; throws std::runtime_error naming the problem.
member_credentials issue_cluster_member(const std::filesystem::path& dir, std::string_view name, int valid_days,
                                        bool replace = false);

}  // namespace troupe
