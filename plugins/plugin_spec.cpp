#include "plugins/plugin_spec.hpp"

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace troupe {

void validate(const plugin_spec& spec) {
  const std::string who = "plugin '" + (spec.name.empty() ? spec.library : spec.name) + "'";
  if (spec.library.empty()) throw std::runtime_error(who + ": no library path");
  for (const std::string& hook : spec.hooks) {
    if (std::find_if(std::begin(plugin_hook_names), std::end(plugin_hook_names),
                     [&](const char* known) { return hook == known; }) == std::end(plugin_hook_names)) {
      throw std::runtime_error(who + ": unknown hook '" + hook + "' (expected request, output, logits or route)");
    }
  }
  if (spec.budget_ms < 1 || spec.budget_ms > 60000) {
    throw std::runtime_error(who + ": budget_ms must be 1 to 60000, got " + std::to_string(spec.budget_ms));
  }
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(spec.config_json);
  } catch (const std::exception& e) {
    throw std::runtime_error(who + ": its config is not JSON: " + e.what());
  }
  if (!config.is_object())
    throw std::runtime_error(who + ": its config must be a JSON object, got " + spec.config_json);
}

plugin_spec parse_plugin_argument(const std::string& argument) {
  plugin_spec spec;
  const size_t comma = argument.find(',');
  spec.library = argument.substr(0, comma);
  if (comma != std::string::npos) spec.config_json = argument.substr(comma + 1);
  if (spec.library.empty()) throw std::runtime_error("--plugin: expected PATH[,CONFIG-JSON], got '" + argument + "'");
  validate(spec);
  return spec;
}

}  // namespace troupe
