#pragma once
// First come, first served: arrival order for admission and for the step's budget; the newest
// running sequence is preempted first. Priorities are ignored.

#include "engine/scheduling_policy.hpp"

namespace troupe {

class fcfs_policy : public scheduling_policy {
 public:
  bool runs_before(const sequence& a, const sequence& b) const override {
    return a.arrival_order() < b.arrival_order();
  }
  sequence* next_waiting(const std::vector<sequence*>& waiting) const override;
};

}  // namespace troupe
