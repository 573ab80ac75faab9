#include "doors/tenant_table.hpp"

#include <cmath>
#include <set>
#include <stdexcept>

#include "doors/api_key.hpp"

namespace troupe {

tenant_table::tenant_table(std::vector<tenant_settings> tenants) : tenants_(std::move(tenants)) {
  std::set<std::string> names, keys;
  for (const tenant_settings& t : tenants_) {
    if (t.name.empty()) throw std::invalid_argument("a tenant without a name");
    const std::string who = "tenant '" + t.name + "'";
    if (!names.insert(t.name).second) throw std::invalid_argument(who + " is listed twice");
    if (!t.api_key.empty() && !keys.insert(t.api_key).second) {
      throw std::invalid_argument(who + ": its api_key is another tenant's too");
    }
    for (char c : t.api_key) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        throw std::invalid_argument(who + ": its api_key holds a control character");
      }
    }
    if (!(t.ttft_ms >= 0) || !std::isfinite(t.ttft_ms) || !(t.tpot_ms >= 0) || !std::isfinite(t.tpot_ms)) {
      throw std::invalid_argument(who + ": ttft_ms and tpot_ms must be zero (none) or positive");
    }
  }
}

bool tenant_table::has_keys() const {
  for (const tenant_settings& t : tenants_) {
    if (!t.api_key.empty()) return true;
  }
  return false;
}

std::optional<std::string> tenant_table::tenant_of_key(std::string_view given) const {
  std::optional<std::string> found;
  for (const tenant_settings& t : tenants_) {
    // No early exit: every key is compared, matched or not.
    if (!t.api_key.empty() && api_key_matches(given, t.api_key) && !found) found = t.name;
  }
  return found;
}

void tenant_table::apply_defaults(int& priority, service_targets& targets) const {
  if (targets.tenant.empty()) return;
  for (const tenant_settings& t : tenants_) {
    if (t.name != targets.tenant) continue;
    if (priority == 0) priority = t.priority;
    if (targets.ttft_ms == 0) targets.ttft_ms = t.ttft_ms;
    if (targets.tpot_ms == 0) targets.tpot_ms = t.tpot_ms;
    return;
  }
}

}  // namespace troupe
