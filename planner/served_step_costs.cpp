#include "planner/served_step_costs.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string_view>

namespace troupe {
namespace {

// The value of `name="..."` in a sample's labels; empty when it has none.
std::string label(std::string_view line, std::string_view name) {
  const std::string key = std::string(name) + "=\"";
  const size_t at = line.find(key);
  if (at == std::string_view::npos) return {};
  const size_t from = at + key.size();
  const size_t to = line.find('"', from);
  return to == std::string_view::npos ? std::string{} : std::string(line.substr(from, to - from));
}

double sample_value(const std::string& line) {
  const size_t close = line.find('}');
  try {
    return std::stod(line.substr(close == std::string::npos ? line.find(' ') : close + 1));
  } catch (const std::exception&) {
    throw std::invalid_argument("a /metrics sample without a number: " + line);
  }
}

struct instance_fit {
  std::string role;
  step_cost cost;
  std::array<bool, step_cost::num_features> seen{};
};

}  // namespace

double served_step_costs::stack_seconds_per_message() const {
  const int64_t messages = num_requests_finished + num_generation_tokens;
  return messages > 0 ? stack_cpu_seconds / static_cast<double>(messages) : 0.0;
}

served_step_costs parse_served_step_costs(const std::string& metrics_text) {
  served_step_costs out;
  std::map<std::string, instance_fit> fits;  // by instance
  std::vector<std::string> order;            // instances in the order the text names them
  std::map<std::string, double> floors;
  std::map<std::string, double> fastest;
  std::stringstream lines(metrics_text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("troupe_kv_blocks_total ", 0) == 0) {
      out.num_kv_blocks = static_cast<int>(sample_value(line));
    } else if (line.rfind("troupe_stack_cpu_seconds_total ", 0) == 0 ||
               line.rfind("troupe_node_stack_cpu_seconds_total{", 0) == 0) {
      out.stack_cpu_seconds += sample_value(line);
      ++out.num_stack_processes;
    } else if (line.rfind("troupe_requests_finished_total{", 0) == 0) {
      out.num_requests_finished += static_cast<int64_t>(sample_value(line));
    } else if (line.rfind("troupe_generation_tokens_total ", 0) == 0) {
      out.num_generation_tokens = static_cast<int64_t>(sample_value(line));
    } else if (line.rfind("troupe_step_time_min_step_seconds{", 0) == 0) {
      fastest[label(line, "instance")] = sample_value(line);
    } else if (line.rfind("troupe_step_time_token_floor{", 0) == 0) {
      floors[label(line, "instance")] = sample_value(line);
    } else if (line.rfind("troupe_step_time_coefficient_seconds{", 0) == 0) {
      const std::string instance = label(line, "instance");
      const std::string feature = label(line, "feature");
      auto [it, added] = fits.try_emplace(instance);
      if (added) order.push_back(instance);
      instance_fit& fit = it->second;
      fit.role = label(line, "role");
      for (size_t j = 0; j < step_cost::num_features; ++j) {
        if (feature == step_cost::feature_name(j)) {
          fit.cost.seconds[j] = sample_value(line);
          fit.seen[j] = true;
        }
      }
    }
  }
  for (const std::string& instance : order) {
    instance_fit& fit = fits[instance];
    if (!std::all_of(fit.seen.begin(), fit.seen.end(), [](bool seen) { return seen; })) continue;
    if (auto floor = floors.find(instance); floor != floors.end()) fit.cost.token_floor = std::max(floor->second, 1.0);
    if (auto least = fastest.find(instance); least != fastest.end())
      fit.cost.min_seconds = std::max(least->second, 0.0);
    // Without a role label the instance ran whatever came: it plans the mixed instances.
    std::optional<step_cost>& slot = fit.role == "prefill"  ? out.prefill
                                     : fit.role == "decode" ? out.decode
                                                            : out.mixed;
    if (!slot) slot = fit.cost;
  }
  return out;
}

}  // namespace troupe
