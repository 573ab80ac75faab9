#include "doors/door_actor.hpp"

#include <unordered_map>

#include "doors/reply_router.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/message_inspect.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

namespace {

// Beyond this many counted requests, those whose clients had their end another way (a node's
// fail_all, from another thread) are dropped from the count.
constexpr size_t max_counted_requests = 65536;

}  // namespace

frontend_handle::behavior_type door_actor(frontend_handle::pointer self, reply_router* router) {
  // Output tokens sent to each running request's client; a request leaves at its end.
  auto delivered = std::make_shared<std::unordered_map<int64_t, int32_t>>();
  return instrumented(self, "frontend",
                      {
                          [router, delivered](text_batch& batch) {
                            for (const text_delta& d : batch.deltas) {
                              if (d.delta.finished()) {
                                delivered->erase(d.delta.request_id);
                              } else {
                                (*delivered)[d.delta.request_id] += static_cast<int32_t>(d.delta.token_ids.size());
                              }
                            }
                            if (delivered->size() > max_counted_requests) {
                              std::erase_if(*delivered,
                                            [router](const auto& entry) { return !router->tracks(entry.first); });
                            }
                            router->route(std::move(batch));
                          },
                          [router, delivered](request_failed& failed) {
                            delivered->erase(failed.request_id);
                            router->route(std::move(failed));
                          },
                          [router](stats_answer& stats) { router->route(std::move(stats)); },
                          [router](trace_answer& trace) { router->route(std::move(trace)); },
                          [router, delivered](delivered_tokens_atom, const std::vector<int64_t>& ids) {
                            std::vector<int32_t> counts;
                            counts.reserve(ids.size());
                            for (int64_t id : ids) {
                              auto it = delivered->find(id);
                              counts.push_back(!router->tracks(id) ? -1 : it == delivered->end() ? 0 : it->second);
                            }
                            return counts;
                          },
                      });
}

}  // namespace troupe
