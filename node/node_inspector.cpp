#include "node/node_inspector.hpp"

#include <memory>
#include <utility>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/response_promise.hpp>

#include "node/inspection.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/message_inspect.hpp"
#include "stages/messages.hpp"

namespace troupe {

namespace {

// One inspection whose schedulers are still answering; the last answer (or timeout) sends it.
struct pending_inspection {
  node_inspection result;
  size_t num_pending = 0;
  caf::response_promise promise;

  void settle() {
    if (--num_pending == 0) promise.deliver(to_json(result).dump());
  }
};

}  // namespace

caf::behavior node_inspector_actor(caf::event_based_actor* self, std::string node, std::chrono::milliseconds timeout) {
  return instrumented(
      self, "inspector",
      {
          [=](inspect_atom) -> caf::result<std::string> {
            auto pending = std::make_shared<pending_inspection>();
            pending->result.node = node;
            const actor_stats_registry* registry = stats_registry_of(self->system());
            if (!registry) {
              pending->result.error = "this node keeps no actor statistics";
              return to_json(pending->result).dump();
            }
            const timestamp_ns now = steady_now_ns();
            std::vector<std::pair<size_t, caf::actor>> schedulers;
            for (const actor_stats_registry::entry& entry : registry->entries()) {
              pending->result.actors.push_back({entry.stage, entry.id, entry.stats->snapshot(now), entry.instance});
              if (entry.stage != "scheduler") continue;
              if (auto scheduler = caf::actor_cast<caf::actor>(entry.actor)) {
                schedulers.emplace_back(pending->result.schedulers.size(), std::move(scheduler));
                scheduler_row row;
                row.actor_id = entry.id;
                row.instance = entry.instance;
                pending->result.schedulers.push_back(std::move(row));
              }
            }
            for (auto& [stage, counters] : registry->plugin_stage_counters()) {
              pending->result.plugins.push_back({stage, std::move(counters)});
            }
            if (schedulers.empty()) return to_json(pending->result).dump();
            pending->num_pending = schedulers.size();
            pending->promise = self->make_response_promise();
            for (auto& [index, scheduler] : schedulers) {
              const size_t i = index;
              self->request(scheduler, timeout, stats_query{0})
                  .then(
                      [pending, i](stats_answer& answer) {
                        scheduler_row& row = pending->result.schedulers[i];
                        row.num_free_blocks = answer.num_free_blocks;
                        row.num_total_blocks = answer.num_total_blocks;
                        row.num_running = answer.num_running;
                        row.num_waiting = answer.num_waiting;
                        row.error = answer.unavailable;
                        row.pipeline_busy = answer.pipeline_busy;
                        pending->settle();
                      },
                      [self, pending, i](caf::error& error) {
                        pending->result.schedulers[i].error = "no answer: " + self->system().render(error);
                        pending->settle();
                      });
            }
            return pending->promise;
          },
      });
}

}  // namespace troupe
