#pragma once
// One plugin a server runs, as plain data: what `troupe serve --plugin` and a topology's
// [[plugins]] table say. It travels inside the stage specs (stages/stage_specs.hpp), so the node
// that runs a stage loads the library itself.

#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

// The hooks a plugin may implement (include/troupe/plugin.h).
inline constexpr const char* plugin_hook_names[] = {"request", "output", "logits", "route"};

struct plugin_spec {
  std::string name;                // for errors and /metrics; "" : the library's own name for itself
  std::string library;             // the shared library's path
  std::string config_json = "{}";  // handed to troupe_plugin_init
  std::vector<std::string> hooks;  // the hooks to run; empty: every one the library implements
  int32_t budget_ms = 50;          // a call that takes longer fails its request
};

// Throws std::runtime_error naming the bad field (an unknown hook, a budget out of range, a
// config that is not a JSON object).
void validate(const plugin_spec& spec);

// `PATH[,CONFIG-JSON]`, the argument of `troupe serve --plugin`.
plugin_spec parse_plugin_argument(const std::string& argument);

}  // namespace troupe
