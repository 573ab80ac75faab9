#include "node/launch_credentials.hpp"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "node/cluster_member_issuer.hpp"
#include "node/local_host.hpp"

namespace troupe {

namespace {

constexpr int member_valid_days = 365;
constexpr int ca_valid_days = 3650;

}  // namespace

std::filesystem::path default_launch_state_dir(const std::filesystem::path& topology_file) {
  std::filesystem::path base;
  if (const char* state = std::getenv("XDG_STATE_HOME"); state && *state) {
    base = state;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    base = std::filesystem::path(home) / ".local" / "state";
  } else {
    throw std::runtime_error("neither XDG_STATE_HOME nor HOME is set: give launch a --state-dir");
  }
  const std::string absolute = std::filesystem::absolute(topology_file).lexically_normal().string();
  uint32_t hash = 2166136261u;  // FNV-1a: a short, stable tag of the path
  for (unsigned char c : absolute) {
    hash ^= c;
    hash *= 16777619u;
  }
  char tag[9];
  std::snprintf(tag, sizeof tag, "%08x", hash);
  return base / "troupe" / "launch" / (topology_file.stem().string() + "-" + tag);
}

std::optional<launch_credentials> local_launch_credentials(const topology& t, const std::filesystem::path& state_dir,
                                                           const std::string& source) {
  if (!t.cluster.credentials.empty()) return std::nullopt;
  if (t.colocated() && t.cluster.admin_listen.empty()) return std::nullopt;
  for (const node_address& n : t.nodes) {
    if (!is_local_host(n.host)) {
      throw std::runtime_error(source + ": node " + n.name + " at " + n.host + ":" + std::to_string(n.port) +
                               " is not this machine, so launch cannot make the cluster's credentials for it: make "
                               "them with `troupe certs`, copy them to every machine and name them in [cluster] "
                               "credentials");
    }
  }
  std::vector<std::string> members{t.cluster.name};
  for (const node_address& n : t.nodes) members.push_back(n.name);
  if (!t.cluster.admin_listen.empty()) members.push_back("admin");  // for `troupe scale --name admin`

  launch_credentials out;
  out.dir = state_dir / "credentials";
  std::filesystem::create_directories(out.dir);
  // Private keys live here: only the user who launches may read them.
  std::filesystem::permissions(state_dir, std::filesystem::perms::owner_all, std::filesystem::perm_options::replace);
  std::filesystem::permissions(out.dir, std::filesystem::perms::owner_all, std::filesystem::perm_options::replace);
  if (!std::filesystem::exists(out.dir / "ca.crt")) {
    make_cluster_ca(out.dir, "launch-" + t.cluster.name, ca_valid_days);  // a member-like name
    out.made_ca = true;
  }
  for (const std::string& name : members) {
    const member_credentials files = credentials_in(out.dir, name);
    if (std::filesystem::exists(files.certificate)) {
      verify_member_credentials(files);  // from an earlier launch: still good (not expired, this CA's)
      continue;
    }
    issue_cluster_member(out.dir, name, member_valid_days);
    ++out.num_issued;
  }
  return out;
}

}  // namespace troupe
