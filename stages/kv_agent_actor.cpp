#include <unordered_map>

#include <caf/event_based_actor.hpp>
#include <spdlog/spdlog.h>

#include "stages/instrumented_actor.hpp"
#include "stages/message_inspect.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

caf::behavior kv_agent_actor(caf::event_based_actor* self, std::shared_ptr<kv_endpoints> endpoints) {
  keep_exception_in_exit_reason(self);
  // Which scheduler reserved each expected transfer: the receiver's word goes back there.
  auto reserved_by = std::make_shared<std::unordered_map<uint64_t, caf::actor>>();
  return instrumented(self, "kv_agent", {
      [=](kv_expect_msg& expect) -> caf::result<kv_ready_msg> {
        const kv_reservation& r = expect.reservation;
        kv_expectation expectation;
        expectation.transfer_id = r.transfer_id;
        expectation.request_id = r.request_id;
        expectation.block_ids = r.block_ids;
        expectation.num_tokens = r.num_tokens;
        expectation.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(expect.timeout_ms);
        // A device transport writes the blocks itself: its frames only count the layers in.
        const bool in_place = !endpoints->kv_pool_handle.empty() || endpoints->device_inbox;
        expectation.in_place = in_place;
        std::string pool_handle = endpoints->kv_pool_handle;
        try {
          if (endpoints->device_inbox) {
            // nccl: the communicator of the prefill peer the router chose, named in the handle.
            nccl_kv_inbox::handle pair = endpoints->device_inbox->handle_for(r.peer);
            pool_handle = std::move(pair.bytes);
            expectation.device_pair = std::move(pair.pair_id);
          }
          endpoints->opened_receiver().expect(std::move(expectation));
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::runtime_error, std::string(e.what()));
        }
        (*reserved_by)[r.transfer_id] = caf::actor_cast<caf::actor>(self->current_sender());
        kv_ready_msg ready{r.request_id, r.transfer_id, endpoints->opened_receiver().endpoint(),
                           endpoints->opened_receiver().public_key()};
        if (in_place) {
          ready.kv_pool_handle = std::move(pool_handle);
          ready.block_ids = r.block_ids;
        }
        return ready;
      },
      // From the receiver's thread (through the mailbox): a transfer completed or failed.
      [=](kv_arrival_msg& arrival) {
        auto it = reserved_by->find(arrival.transfer_id);
        if (it == reserved_by->end()) return;  // cancelled meanwhile
        self->send(it->second, std::move(arrival));
        reserved_by->erase(it);
      },
      [=](kv_cancel_msg& cancel) {
        if (endpoints->receiver) endpoints->receiver->cancel(cancel.transfer_id);
        reserved_by->erase(cancel.transfer_id);
      },
      // From the router: where a transfer this instance prefills must go.
      [=](kv_ready_msg& ready) {
        if (!ready.kv_pool_handle.empty() || endpoints->device_destinations) {
          if (!endpoints->device_destinations || ready.kv_pool_handle.empty()) {
            // Every worker of a topology has the same transport; two that differ cannot meet.
            spdlog::warn("kv agent: transfer {} of request {}: the decode side {} a device destination, this worker's "
                         "KV transport {} one; its receiver will time out",
                         ready.transfer_id, ready.request_id, ready.kv_pool_handle.empty() ? "gave no" : "gave",
                         endpoints->device_destinations ? "needs" : "takes no");
          } else {
            try {
              endpoints->device_destinations->put(
                  ready.transfer_id, kv_device_destination{std::move(ready.kv_pool_handle), std::move(ready.block_ids)},
                  std::chrono::steady_clock::now() + endpoints->transfer_timeout);
            } catch (const std::exception& e) {
              spdlog::warn("kv agent: request {}: {}; its receiver will time out", ready.request_id, e.what());
            }
          }
        }
        endpoints->sender->ready(ready.transfer_id, std::move(ready.endpoint), std::move(ready.public_key));
      },
      [=](kv_leases_atom) -> kv_lease_counts {
        const kv_receiver_stats in = endpoints->receiver ? endpoints->receiver->stats() : kv_receiver_stats{};
        const kv_sender_stats out = endpoints->sender->stats();
        return kv_lease_counts{static_cast<int32_t>(in.num_expected), static_cast<int32_t>(out.num_transfers),
                               in.num_refused};
      },
  });
}

}  // namespace troupe
