#include <unordered_map>

#include <caf/event_based_actor.hpp>
#include <spdlog/spdlog.h>

#include "stages/error_category.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/message_inspect.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

kv_agent_handle::behavior_type kv_agent_actor(kv_agent_handle::pointer self, std::shared_ptr<kv_connector> connector) {
  keep_exception_in_exit_reason(self);
  // Which scheduler reserved each expected transfer: the receiver's word goes back there.
  auto reserved_by = std::make_shared<std::unordered_map<uint64_t, scheduler_handle>>();
  // The router, as its first kv_ready names it: where this prefill side's sender failures go.
  auto router = std::make_shared<router_handle>();
  return instrumented(
      self, "kv_agent",
      {
          [=](kv_expect_msg& expect) -> caf::result<kv_ready_msg> {
            kv_destination d;
            try {
              d = connector->expect(expect.reservation, std::chrono::milliseconds(expect.timeout_ms));
            } catch (const std::exception& e) {
              return caf::make_error(error_code::unavailable, std::string(e.what()));
            }
            (*reserved_by)[d.transfer_id] = caf::actor_cast<scheduler_handle>(self->current_sender());
            std::vector<std::string> routes;
            for (const kv_stage_route& route : d.stage_routes) routes.push_back(kv_stage_route_text(route));
            return kv_ready_msg{d.request_id,
                                d.transfer_id,
                                std::move(d.endpoint),
                                std::move(d.public_key),
                                std::move(d.kv_pool_handle),
                                std::move(d.block_ids),
                                std::move(routes)};
          },
          // From the receiver's thread (through the mailbox): a transfer completed or failed.
          [=](kv_arrival_msg& arrival) {
            auto it = reserved_by->find(arrival.transfer_id);
            if (it == reserved_by->end()) return;  // cancelled meanwhile
            self->send(it->second, std::move(arrival));
            reserved_by->erase(it);
          },
          [=](kv_cancel_msg& cancel) {
            connector->cancel(cancel.transfer_id);
            reserved_by->erase(cancel.transfer_id);
          },
          // From the router: where a transfer this instance prefills must go.
          [=](kv_ready_msg& ready) {
            if (!*router) *router = caf::actor_cast<router_handle>(self->current_sender());
            // From another node each route was checked when the message was read (message_inspect.hpp).
            std::vector<kv_stage_route> routes;
            try {
              for (const std::string& route : ready.stage_routes) routes.push_back(parse_kv_stage_route(route));
            } catch (const std::invalid_argument& e) {
              spdlog::warn("kv agent: transfer {}: {}; its receiver will time out", ready.transfer_id, e.what());
              return;
            }
            connector->send_to(kv_destination{ready.request_id, ready.transfer_id, std::move(ready.endpoint),
                                              std::move(ready.public_key), std::move(ready.kv_pool_handle),
                                              std::move(ready.block_ids), std::move(routes)});
          },
          // From the sender's thread (through the mailbox): it gave a transfer up. The router re-runs
          // the request now instead of leaving its decode half to wait for the same deadline.
          [=](kv_failed_msg& failed) {
            if (*router) self->send(*router, std::move(failed));
          },
          [=](kv_leases_atom) -> kv_lease_counts {
            const kv_connector_leases leases = connector->leases();
            return kv_lease_counts{leases.num_expected, leases.num_sending, leases.num_refused_frames};
          },
      });
}

}  // namespace troupe
