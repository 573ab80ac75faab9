#include "node/cluster_member_issuer.hpp"

#include "kvtransfer/kv_channel.hpp"

namespace troupe {

member_credentials issue_cluster_member(const std::filesystem::path& dir, std::string_view name, int valid_days,
                                        bool replace) {
  const member_credentials files = issue_member_certificate(dir, name, valid_days, replace);
  verify_member_credentials(files);
  write_kv_channel_keys(dir, name, replace);
  return files;
}

}  // namespace troupe
