#include "engine/priority_policy.hpp"

#include <algorithm>

namespace troupe {

sequence* priority_policy::next_waiting(const std::vector<sequence*>& waiting) const {
  return *std::min_element(waiting.begin(), waiting.end(),
                           [this](const sequence* a, const sequence* b) { return runs_before(*a, *b); });
}

}  // namespace troupe
