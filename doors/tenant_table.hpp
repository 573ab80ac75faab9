#pragma once
// Per-tenant defaults and keys (`[[tenants]]` in a topology): a request's tenant gets its
// tenant's priority and SLO targets where the request left them unset, and a tenant may have an
// API key of its own. A request that comes with a tenant's key is that tenant whatever `tenant`
// (or `user`) it claims, so one client cannot spend another's fair share or targets; a request
// with the server's key (or on a server without one) is the tenant it names.
//
// Immutable after construction, so both doors' threads read it without a lock.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/service_targets.hpp"

namespace troupe {

struct tenant_settings {
  std::string name;
  std::string api_key;  // empty: none of its own
  int priority = 0;     // lower runs first; applied when the request gives 0
  double ttft_ms = 0;   // applied when the request gives none (0)
  double tpot_ms = 0;
};

class tenant_table {
 public:
  tenant_table() = default;
  // Throws std::invalid_argument naming the tenant: no name, a name or key given twice, a negative
  // or non-finite target, a key with a control character.
  explicit tenant_table(std::vector<tenant_settings> tenants);

  bool empty() const { return tenants_.empty(); }
  bool has_keys() const;
  // The tenant whose key `given` is, or nullopt. Every tenant's key is compared in full whatever
  // matches (api_key_matches), so timing does not tell which key a guess was near.
  std::optional<std::string> tenant_of_key(std::string_view given) const;
  // Fills the priority and targets a request left unset from its tenant's defaults (the tenant
  // `targets.tenant` names; nothing for an unknown or anonymous tenant).
  void apply_defaults(int& priority, service_targets& targets) const;

 private:
  std::vector<tenant_settings> tenants_;
};

}  // namespace troupe
