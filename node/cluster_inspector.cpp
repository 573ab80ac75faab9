#include "node/cluster_inspector.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include <caf/response_promise.hpp>

#include "node/inspection.hpp"
#include "node/node_inspector.hpp"
#include "node/node_link.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

namespace {

// A node that could not be connected to is left alone this long before the next try.
constexpr std::chrono::seconds retry_after{3};

struct known_node {
  caf::actor agent;                          // null until connected, or after a failed answer
  std::chrono::steady_clock::time_point failed_at{};  // of the last failed connect
  std::string failure;
};

// One inspection under way; the last node to answer (or time out) sends it.
struct pending_inspection {
  cluster_inspection result;
  size_t num_pending = 0;
  caf::response_promise promise;

  void settle() {
    if (--num_pending == 0) promise.deliver(to_json(result).dump());
  }
};

void fill(node_inspection& slot, const std::string& json) {
  const std::string name = slot.node;
  try {
    slot = node_inspection_from_json(nlohmann::json::parse(json));
    slot.node = name;  // the topology's name for it, whatever it calls itself
  } catch (const std::exception& e) {
    slot.reachable = false;
    slot.error = std::string("its answer was not an inspection: ") + e.what();
  }
}

}  // namespace

caf::behavior cluster_inspector_actor(caf::event_based_actor* self, const topology* t, caf::actor local,
                                      std::chrono::milliseconds timeout) {
  self->link_to(local);  // they go together
  // Connecting waits at most a second here: the view refreshes every second.
  auto quick = std::make_shared<cluster_settings>(t->cluster);
  quick->connect_timeout_ms = std::min(quick->connect_timeout_ms, 1000);
  auto nodes = std::make_shared<std::map<std::string, known_node>>();
  return instrumented(self, "cluster-inspector", {
      [=](inspect_atom atom) -> caf::result<std::string> {
        auto pending = std::make_shared<pending_inspection>();
        pending->promise = self->make_response_promise();
        pending->result.taken_at_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                               std::chrono::system_clock::now().time_since_epoch())
                                               .count();
        pending->result.nodes.resize(1 + t->nodes.size());
        pending->result.nodes[0].node = t->cluster.name;
        pending->num_pending = 2;  // the controller, and a hold until every request is out
        auto ask = [=](const caf::actor& whom, size_t index) {
          self->request(whom, timeout, atom)
              .then(
                  [=](std::string& json) {
                    fill(pending->result.nodes[index], json);
                    pending->settle();
                  },
                  [=](caf::error& error) {
                    node_inspection& slot = pending->result.nodes[index];
                    slot.reachable = false;
                    slot.error = "no answer within " + std::to_string(timeout.count()) +
                                 " ms: " + self->system().render(error);
                    if (index > 0) (*nodes)[slot.node].agent = nullptr;  // connect again next time
                    pending->settle();
                  });
        };
        ask(local, 0);
        node_link link(self->system(), *quick);
        for (size_t i = 0; i < t->nodes.size(); ++i) {
          const node_address& address = t->nodes[i];
          node_inspection& slot = pending->result.nodes[i + 1];
          slot.node = address.name;
          known_node& known = (*nodes)[address.name];
          const auto now = std::chrono::steady_clock::now();
          if (!known.agent && now - known.failed_at >= retry_after) {
            try {
              known.agent = link.connect(address);
            } catch (const std::exception& e) {
              known.failed_at = now;
              known.failure = e.what();
            }
          }
          if (!known.agent) {
            slot.reachable = false;
            slot.error = known.failure;
            continue;
          }
          ++pending->num_pending;
          ask(known.agent, i + 1);
        }
        pending->settle();  // the count's first 1 held it open while the requests went out
        return pending->promise;
      },
  });
}

}  // namespace troupe
