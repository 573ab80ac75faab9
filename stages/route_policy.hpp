#pragma once
// A routing policy the router consults before its own (stages/engine_router.hpp): given the
// instances that may take a request, with their loads and the router's prefix-hit estimates,
// it chooses one, has no opinion (the router's load and prefix-affinity policy decides), or
// fails the request. The serving implementation (stages/plugin_route_policy.hpp) runs the route
// hooks of plugins (include/troupe/plugin.h); the router itself loads no library.
//
// Contract, as the router keeps it: called on the router's one thread, once per dispatch (a
// re-run after its instance was lost is dispatched again), with at least one active candidate.
// The router checks the answer again: an index past the candidates, or one of a draining
// candidate, fails the request as an error of the policy (it never crashes the router).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "stages/engine_role.hpp"
#include "stages/messages.hpp"

namespace troupe {

struct route_candidate {
  engine_instance_id id = 0;
  std::string node;
  engine_role role = engine_role::mixed;
  engine_state state = engine_state::active;  // a draining one must not be chosen
  engine_load load;                           // as the instance last reported
  int32_t num_requests = 0;                   // routed there and not finished
  int64_t num_queued_prompt_tokens = 0;       // of those without a first token yet
  int64_t prefix_hit_tokens = -1;             // the router's estimate for this request; -1: none
};

// The request being dispatched, as a policy sees it.
struct route_query {
  int64_t request_id = 0;
  std::string tenant;  // "": anonymous
  size_t num_prompt_ids = 0;
  size_t num_resumed_ids = 0;  // a re-run: tokens already generated on a lost instance
};

struct route_decision {
  enum class kind { no_opinion, chosen, failed };
  kind what = kind::no_opinion;
  size_t index = 0;     // chosen: into the candidates
  std::string message;  // failed: why, naming the policy (the client's error)

  static route_decision no_opinion() { return {}; }
  static route_decision choose(size_t index) { return {kind::chosen, index, {}}; }
  static route_decision fail(std::string message) { return {kind::failed, 0, std::move(message)}; }
};

class route_policy {
 public:
  virtual ~route_policy() = default;
  // For the router's own messages about the policy's answers ("plugin 'affinity'").
  virtual std::string name() const = 0;
  virtual route_decision choose(const route_query& request, const std::vector<route_candidate>& candidates) = 0;
};

}  // namespace troupe
