#pragma once
// Priority first (lower runs first), then arrival, for admission and the step's budget; the
// lowest-priority, newest running sequence is preempted first. A waiting request of strictly
// higher priority that finds no free blocks or no seat preempts it, so an urgent request does not
// wait for a batch of background ones to finish; equal priorities never preempt each other.

#include "engine/scheduling_policy.hpp"

namespace troupe {

class priority_policy : public scheduling_policy {
 public:
  bool runs_before(const sequence& a, const sequence& b) const override {
    if (a.priority() != b.priority()) return a.priority() < b.priority();
    return a.arrival_order() < b.arrival_order();
  }
  sequence* next_waiting(const std::vector<sequence*>& waiting) const override;
  bool preempts(const sequence& head, const sequence& victim) const override {
    return head.priority() < victim.priority();
  }
};

}  // namespace troupe
