#pragma once
// The router's route policy (stages/route_policy.hpp) over the plugins that run on_route
// (plugins/plugin_chain): the candidates go to the plugins' route hooks as the C ABI's
// troupe_route_candidate, each call timed and its answer checked there; a failure's message
// names the plugin.

#include <memory>

#include "plugins/plugin_chain.hpp"
#include "stages/route_policy.hpp"

namespace troupe {

class plugin_route_policy final : public route_policy {
 public:
  // `plugins`: a chain built for the "route" hook, not empty.
  explicit plugin_route_policy(std::shared_ptr<plugin_chain> plugins) : plugins_(std::move(plugins)) {}

  std::string name() const override;
  route_decision choose(const route_query& request, const std::vector<route_candidate>& candidates) override;

 private:
  std::shared_ptr<plugin_chain> plugins_;
};

}  // namespace troupe
