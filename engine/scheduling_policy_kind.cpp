#include "engine/scheduling_policy_kind.hpp"

#include <stdexcept>
#include <string>

namespace troupe {

scheduling_policy_kind parse_scheduling_policy(std::string_view name) {
  if (name == "fcfs") return scheduling_policy_kind::fcfs;
  if (name == "priority") return scheduling_policy_kind::priority;
  if (name == "slo") return scheduling_policy_kind::slo;
  if (name == "fair") return scheduling_policy_kind::fair;
  throw std::invalid_argument("scheduling policy \"" + std::string(name) +
                              "\" is not one of fcfs, priority, slo, fair");
}

slo_admission_mode parse_slo_admission(std::string_view name) {
  if (name == "best_effort") return slo_admission_mode::best_effort;
  if (name == "reject") return slo_admission_mode::reject;
  throw std::invalid_argument("slo_admission \"" + std::string(name) + "\" is not one of reject, best_effort");
}

std::string_view scheduling_policy_name(scheduling_policy_kind kind) {
  switch (kind) {
    case scheduling_policy_kind::fcfs: return "fcfs";
    case scheduling_policy_kind::slo: return "slo";
    case scheduling_policy_kind::fair: return "fair";
    default: return "priority";
  }
}

std::string_view slo_admission_name(slo_admission_mode mode) {
  return mode == slo_admission_mode::reject ? "reject" : "best_effort";
}

}  // namespace troupe
