#include "node/cluster_inspector.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>

#include <caf/actor_cast.hpp>
#include <caf/io/middleman.hpp>
#include <caf/response_promise.hpp>

#include "node/inspection.hpp"
#include "node/node_inspector.hpp"
#include "node/tls_middleman.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

namespace {

// A node that could not be connected to is left alone this long before the next try.
constexpr std::chrono::seconds retry_after{3};
// Connecting (TLS and CAF's handshake) waits at most this: the view refreshes every second.
constexpr std::chrono::milliseconds connect_timeout{1000};

struct known_node {
  caf::actor agent;                                   // null until connected, or after a failed answer
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
  auto nodes = std::make_shared<std::map<std::string, known_node>>();
  return instrumented(
      self, "cluster-inspector",
      {
          [=](inspect_atom atom) -> caf::result<std::string> {
            auto pending = std::make_shared<pending_inspection>();
            pending->promise = self->make_response_promise();
            pending->result.taken_at_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                                   std::chrono::system_clock::now().time_since_epoch())
                                                   .count();
            pending->result.nodes.resize(1 + t->nodes.size());
            pending->result.nodes[0].node = t->cluster.name;
            // One per node that is asked, and a hold until every request is out.
            pending->num_pending = 1;
            auto unreachable = [=](size_t index, std::string why) {
              node_inspection& slot = pending->result.nodes[index];
              slot.reachable = false;
              slot.error = std::move(why);
            };
            auto ask = [=](const caf::actor& whom, size_t index) {
              self->request(whom, timeout, atom)
                  .then(
                      [=](std::string& json) {
                        fill(pending->result.nodes[index], json);
                        pending->settle();
                      },
                      [=](caf::error& error) {
                        unreachable(index, "no answer within " + std::to_string(timeout.count()) +
                                               " ms: " + self->system().render(error));
                        if (index > 0) (*nodes)[pending->result.nodes[index].node].agent = nullptr;  // connect anew
                        pending->settle();
                      });
            };
            ++pending->num_pending;
            ask(local, 0);
            for (size_t i = 0; i < t->nodes.size(); ++i) {
              const node_address& address = t->nodes[i];
              const size_t index = i + 1;
              pending->result.nodes[index].node = address.name;
              known_node& known = (*nodes)[address.name];
              if (known.agent) {
                ++pending->num_pending;
                ask(known.agent, index);
                continue;
              }
              if (std::chrono::steady_clock::now() - known.failed_at < retry_after) {
                unreachable(index, known.failure);
                continue;
              }
              // Connected through the TLS middleman's actor without blocking this actor, with a bound.
              ++pending->num_pending;
              const std::string name = address.name;
              auto failed = [=](std::string why) {
                known_node& k = (*nodes)[name];
                k.failed_at = std::chrono::steady_clock::now();
                k.failure = "cannot connect to node " + name + " at " + address.host + ":" +
                            std::to_string(address.port) + ": " + why;
                unreachable(index, k.failure);
                pending->settle();
              };
              self->request(tls_middleman_of(self->system()), connect_timeout, caf::connect_atom::value, address.host,
                            address.port)
                  .then(
                      [=](const caf::node_id&, caf::strong_actor_ptr& agent, const std::set<std::string>&) {
                        if (!agent) return failed("nothing is published on that port");
                        caf::actor handle = caf::actor_cast<caf::actor>(std::move(agent));
                        (*nodes)[name].agent = handle;
                        ask(handle, index);
                      },
                      [=](caf::error& error) { failed(self->system().render(error)); });
            }
            pending->settle();  // the hold: every request is out
            return pending->promise;
          },
      });
}

}  // namespace troupe
