#pragma once
// The names an operator gives the scheduling policy and SLO admission ([scheduler] policy and
// slo_admission, --scheduling-policy, --slo-admission), parsed once where they are read: past
// that, the engine compares enums, never text.

#include <cstdint>
#include <string_view>

namespace troupe {

// How the waiting queue is ordered (engine/scheduling_policy.hpp).
enum class scheduling_policy_kind : uint8_t { fcfs, priority, slo, fair };

// What the slo policy does with a request whose TTFT target cannot be met given the queue ahead.
enum class slo_admission_mode : uint8_t {
  best_effort,  // serve it, late
  reject,       // refuse it at once (overloaded)
};

// Each throws std::invalid_argument naming the value and the names it may take.
scheduling_policy_kind parse_scheduling_policy(std::string_view name);
slo_admission_mode parse_slo_admission(std::string_view name);
std::string_view scheduling_policy_name(scheduling_policy_kind kind);
std::string_view slo_admission_name(slo_admission_mode mode);

}  // namespace troupe
