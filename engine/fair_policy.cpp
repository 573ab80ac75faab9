#include "engine/fair_policy.hpp"

#include <algorithm>

namespace troupe {

sequence* fair_policy::next_waiting(const std::vector<sequence*>& waiting) const {
  sequence* best = nullptr;
  double best_count = 0;
  for (sequence* seq : waiting) {
    const double count = virtual_tokens(seq->targets().tenant);
    if (best == nullptr || count < best_count ||
        (count == best_count && seq->arrival_order() < best->arrival_order())) {
      best = seq;
      best_count = count;
    }
  }
  return best;
}

void fair_policy::charge(const sequence& seq, int num_tokens) {
  auto it = tenants_.find(seq.targets().tenant);
  if (it != tenants_.end()) it->second.virtual_tokens += num_tokens;
}

void fair_policy::arrived(const sequence& seq) {
  bool any = false;
  double floor = 0;
  for (const auto& [name, state] : tenants_) {
    if (name == seq.targets().tenant) continue;
    floor = any ? std::min(floor, state.virtual_tokens) : state.virtual_tokens;
    any = true;
  }
  tenant_state& state = tenants_[seq.targets().tenant];
  if (state.num_live == 0) state.virtual_tokens = std::max(state.virtual_tokens, floor);
  ++state.num_live;
}

void fair_policy::left(const sequence& seq) {
  auto it = tenants_.find(seq.targets().tenant);
  if (it == tenants_.end()) return;
  if (--it->second.num_live <= 0) tenants_.erase(it);
}

double fair_policy::virtual_tokens(const std::string& tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.virtual_tokens;
}

}  // namespace troupe
