#include "engine/scheduling_policy.hpp"

#include "engine/fair_policy.hpp"
#include "engine/fcfs_policy.hpp"
#include "engine/priority_policy.hpp"
#include "engine/slo_policy.hpp"

namespace troupe {

std::unique_ptr<scheduling_policy> make_scheduling_policy(const engine_config& config,
                                                          const step_time_model& step_times) {
  switch (config.scheduling_policy) {
    case scheduling_policy_kind::fcfs: return std::make_unique<fcfs_policy>();
    case scheduling_policy_kind::slo: return std::make_unique<slo_policy>(config, step_times);
    case scheduling_policy_kind::fair: return std::make_unique<fair_policy>();
    case scheduling_policy_kind::priority: break;
  }
  return std::make_unique<priority_policy>();
}

}  // namespace troupe
