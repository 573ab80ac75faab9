#include "node/topology_files.hpp"

#include <filesystem>
#include <map>
#include <stdexcept>

#include "node/cluster_credentials.hpp"

namespace troupe {

namespace {

// "a, b and c"
std::string listed(const std::set<std::string>& names) {
  std::string text;
  size_t i = 0;
  for (const std::string& name : names) {
    if (i > 0) text += i + 1 == names.size() ? " and " : ", ";
    text += name;
    ++i;
  }
  return text;
}

bool file_exists(const std::filesystem::path& path) {
  std::error_code ignored;
  return std::filesystem::exists(path, ignored);
}

}  // namespace

std::vector<std::string> missing_topology_files(const topology& t, const std::set<std::string>& members) {
  // Which members here run which stages.
  std::set<std::string> with_stages, with_engines;
  const stage_placement& p = t.placement;
  for (const auto* list : {&p.engines, &p.prefill, &p.decode}) {
    for (const std::string& node : *list) {
      if (members.count(node)) with_engines.insert(node);
    }
  }
  with_stages = with_engines;
  for (const auto* list : {&p.tokenizers, &p.detokenizers}) {
    for (const std::string& node : *list) {
      if (members.count(node)) with_stages.insert(node);
    }
  }
  for (const std::string& node : t.pipeline_stage_nodes) {  // a `troupe stage` loads its layers
    if (members.count(node)) with_stages.insert(node);
  }

  std::vector<std::string> missing;
  if (!with_stages.empty() && !t.model.path.empty() && !file_exists(t.model.path)) {
    missing.push_back("[model] path '" + t.model.path + "' does not exist (the stages on " + listed(with_stages) + ")");
  }
  if (!with_engines.empty() && !t.speculative.draft_model.empty() && !file_exists(t.speculative.draft_model)) {
    missing.push_back("[speculative] draft_model '" + t.speculative.draft_model + "' does not exist (the engines on " +
                      listed(with_engines) + ")");
  }

  // Credentials: each node always (mutual TLS), the controller when it joins a cluster.
  const bool controller_joins = !t.colocated() || !t.cluster.admin_listen.empty();
  std::set<std::string> with_credentials;
  for (const std::string& member : members) {
    if (member != t.cluster.name || controller_joins) with_credentials.insert(member);
  }
  if (with_credentials.empty() || t.cluster.credentials.empty()) return missing;
  if (!file_exists(t.cluster.credentials)) {
    missing.push_back("[cluster] credentials '" + t.cluster.credentials.string() + "' does not exist (" +
                      listed(with_credentials) + "; make it with `troupe certs`)");
    return missing;
  }
  // The CA is everyone's: named once.
  std::map<std::filesystem::path, std::set<std::string>> files;
  for (const std::string& member : with_credentials) {
    const member_credentials c = credentials_in(t.cluster.credentials, member);
    for (const auto& path : {c.ca_certificate, c.certificate, c.private_key}) files[path].insert(member);
  }
  for (const auto& [path, owners] : files) {
    if (!file_exists(path)) {
      missing.push_back("[cluster] credentials file '" + path.string() + "' does not exist (" + listed(owners) +
                        "; `troupe certs --name NAME` makes a member's)");
    }
  }
  return missing;
}

void check_topology_files(const topology& t, const std::set<std::string>& members, const std::string& source) {
  const std::vector<std::string> missing = missing_topology_files(t, members);
  if (missing.empty()) return;
  std::string message = source + ": ";
  for (size_t i = 0; i < missing.size(); ++i) message += (i > 0 ? "; " : "") + missing[i];
  throw std::runtime_error(message);
}

}  // namespace troupe
