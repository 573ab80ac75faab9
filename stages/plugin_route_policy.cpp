#include "stages/plugin_route_policy.hpp"

namespace troupe {

std::string plugin_route_policy::name() const {
  std::string names;
  for (const std::string& name : plugins_->names_running("route")) {
    names += (names.empty() ? "'" : ", '") + name + "'";
  }
  return "route plugin " + names;
}

route_decision plugin_route_policy::choose(const route_query& request, const std::vector<route_candidate>& candidates) {
  // The C view borrows the candidates' strings: valid for the calls below only, as the ABI says.
  std::vector<troupe_route_candidate> c_candidates(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    const route_candidate& from = candidates[i];
    troupe_route_candidate& to = c_candidates[i];
    to.instance_id = from.id;
    to.role = static_cast<int32_t>(from.role);
    to.draining = from.state == engine_state::draining ? 1 : 0;
    to.node = from.node.data();
    to.node_len = from.node.size();
    to.num_free_blocks = from.load.num_free_blocks;
    to.num_total_blocks = from.load.num_total_blocks;
    to.num_running = from.load.num_running;
    to.num_waiting = from.load.num_waiting;
    to.num_requests = from.num_requests;
    to.num_queued_prompt_tokens = from.num_queued_prompt_tokens;
    to.prefix_hit_tokens = from.prefix_hit_tokens;
  }
  troupe_route_request c_request{};
  c_request.request_id = request.request_id;
  c_request.tenant = request.tenant.data();
  c_request.tenant_len = request.tenant.size();
  c_request.num_prompt_ids = request.num_prompt_ids;
  c_request.num_resumed_ids = request.num_resumed_ids;
  c_request.candidates = c_candidates.data();
  c_request.num_candidates = c_candidates.size();
  plugin_chain::route_answer answer = plugins_->on_route(c_request);
  if (answer.failure) return route_decision::fail(std::move(answer.failure->message));
  if (answer.chosen) return route_decision::choose(*answer.chosen);
  return route_decision::no_opinion();
}

}  // namespace troupe
