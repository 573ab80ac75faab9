#pragma once
// Token-weighted fair queuing across tenants. Each tenant has a virtual token counter that grows
// by every token a step computes for it (prefill and decode alike); the waiting request of the
// tenant with the smallest counter is admitted next (arrival breaks ties). A heavy tenant's
// counter runs ahead, so a light tenant's requests pass its queue; no tenant starves, since
// whoever is served falls behind whoever waits. A tenant that comes back from idle starts at the
// smallest counter among the tenants with live requests: idling earns no credit to burst with.
// Counters are kept for tenants with live requests only (bounded memory).

#include <string>
#include <unordered_map>
#include <vector>

#include "engine/scheduling_policy.hpp"

namespace troupe {

class fair_policy : public scheduling_policy {
 public:
  bool runs_before(const sequence& a, const sequence& b) const override {
    return a.arrival_order() < b.arrival_order();
  }
  sequence* next_waiting(const std::vector<sequence*>& waiting) const override;
  void charge(const sequence& seq, int num_tokens) override;
  void arrived(const sequence& seq) override;
  void left(const sequence& seq) override;

  // The tenant's virtual token count (0 for a tenant with no live request).
  double virtual_tokens(const std::string& tenant) const;

 private:
  struct tenant_state {
    double virtual_tokens = 0;
    int num_live = 0;
  };
  std::unordered_map<std::string, tenant_state> tenants_;
};

}  // namespace troupe
