#pragma once
// The stage actors of a node. Each is a thin shell over a plain class: a message comes in, a call
// is made, messages go out. Included only by the actor files and the node (it pulls in CAF).
//
// What each stage takes and answers is its typed interface (stages/stage_interfaces.hpp); what
// each message carries is docs/architecture.md ("Messages"). Every stage but the KV agent and the
// doors' actor also takes a stage_failure_drill (node::fail_stage), which makes it throw.

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/behavior.hpp>
#include <caf/error.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "engine/engine_config.hpp"
#include "kvtransfer/kv_connector.hpp"
#include "stages/engine_router.hpp"
#include "stages/error_category.hpp"
#include "plugins/plugin_chain.hpp"
#include "stages/stage_interfaces.hpp"
#include "stages/stage_specs.hpp"

namespace troupe {

// Makes an exception that escapes one of `self`'s handlers end the actor with an `internal` error
// carrying the exception's message as its exit reason (CAF's default keeps only "runtime_error"),
// so the node's monitor can say what failed. Errors are values between actors
// (stages/error_category.hpp); this is the last guard for a bug, not a way to answer. Every stage
// actor calls it first.
inline void keep_exception_in_exit_reason(caf::scheduled_actor* self) {
  self->set_exception_handler([](std::exception_ptr& thrown) -> caf::error {
    try {
      std::rethrow_exception(thrown);
    } catch (const std::exception& e) {
      return caf::make_error(error_code::internal, std::string(e.what()));
    } catch (...) {
      return caf::make_error(error_code::internal, std::string("an exception that is not a std::exception"));
    }
  });
}

// Makes `self` end when `peer` does, with peer's reason. A stage spawned by a controller watches
// the controller's actor it sends to: when the controller is gone (its node's connection lost,
// which kills every proxy of it), the stage stops rather than hold its memory for no one.
template <class Handle>
void quit_with(caf::scheduled_actor* self, const Handle& peer) {
  self->monitor(peer);
  self->set_down_handler([self, watched = peer.address()](caf::down_msg& down) {
    if (down.source == watched) self->quit(down.reason);
  });
}

// A stage_failure_drill's handler: throws its reason, as a bug in the stage would.
inline void fail_for_drill(const std::string& reason) { throw std::runtime_error("failure drill: " + reason); }

class tokenize_stage;
class detokenize_stage;
struct served_model;

// `frontend` below is the doors' actor (doors/door_actor.hpp): replies go there.

tokenizer_handle::behavior_type tokenizer_actor(tokenizer_handle::pointer self,
                                                std::shared_ptr<const tokenize_stage> stage, router_handle router,
                                                frontend_handle frontend);

// Owns the engine's scheduler; keeps one step in flight (two with async_scheduling) and plans
// the next one as soon as a result arrives. Never blocks. Token batches (with the instance's
// load) and refusals go to `router`; a stats_query is answered as the response.
// `kv_agent` is its worker's (disaggregated requests reserve transfers there). A pipelined
// engine's requests wait up to `pipeline_failover_wait` for a lost stage to come back; the actor
// ticks itself (pipeline_tick_atom) meanwhile (stages/scheduler_stage.hpp).
scheduler_handle::behavior_type scheduler_actor(scheduler_handle::pointer self, engine_config config,
                                                std::vector<int32_t> eos_token_ids, worker_handle worker,
                                                router_handle router, kv_agent_handle kv_agent,
                                                std::chrono::milliseconds kv_transfer_timeout,
                                                std::chrono::milliseconds pipeline_failover_wait);

// The router (stages/engine_router.hpp), always on the controller: it is local, so its spec may
// hold a callback. Its interface (router_handle) is in stages/stage_interfaces.hpp.

struct router_spec {
  int block_size = 16;                               // the engines' KV block size
  std::vector<detokenizer_handle> detokenizers;      // a request's deltas go to detokenizers[detokenizer_of(id, size)]
  frontend_handle reply_to;                          // requests that no instance can take; stats answers
  std::chrono::milliseconds request_timeout{30000};  // a stats query to an instance
  // Called when an instance is lost (not drained), after its requests were re-run elsewhere:
  // the controller places a new one when it can.
  std::function<void(engine_instance_id, const std::string& node, engine_role role)> on_engine_lost;
  // Called for each request a tokenizer passes on, as the router takes it: it is no longer the
  // tokenizer's (the controller stops keeping it for a re-tokenization).
  std::function<void(int64_t request_id)> on_tokenized;
  // Called on (retokenize_atom): the controller sends the requests still held for a lost
  // tokenizer to the tokenizers left.
  std::function<void()> on_tokenizer_lost;
  // Keep what goes to the detokenizers (stages/detokenizer_ledger.hpp) so that one lost with its
  // node can be replaced mid-stream: set when a detokenizer runs on another node.
  bool keep_detokenizer_ledger = false;
  // The plugins whose route hooks choose instances before the router's own policy (a chain built
  // for "route"; null or empty: none). Loaded by the controller, so a bad library fails serve.
  std::shared_ptr<plugin_chain> route_plugins;
  // [cluster] failover_wait_ms, failover_max_waiting: how long and how many requests wait for an
  // instance while none takes requests (stages/engine_router.hpp, "Failover wait").
  failover_wait_settings failover_wait;
  // [disaggregation] reservation_wait_ms: when a decode instance is behind (stages/engine_router.hpp,
  // "Pair admission").
  pair_admission_settings pair_admission;
};
router_handle::behavior_type router_actor(router_handle::pointer self, router_spec spec);

// Owns the model and its runner; spawned detached (it computes, so it gets its own thread).
// Answers (describe_atom) with its worker_description. It also owns the instance's KV data plane
// (a sender and a receiver over its model) and spawns, linked, the KV agent that speaks for them.
struct worker_kv_settings {
  std::string bind_host = "127.0.0.1";
  std::chrono::milliseconds transfer_timeout{10000};
  kv_channel_keys keys;
  kv_transport transport = kv_transport::zmq;  // a GPU one is refused by name where it cannot run
  bool stage_pairs = false;                    // kv_connector_settings::stage_pairs
};
// Speculative decoding's drafts on a worker: its loaded draft model, or (none) n-gram prompt
// lookup with `ngram`.
struct worker_drafts {
  std::shared_ptr<served_model> draft_model;
  ngram_settings ngram;
};
// Loads the draft model `spec` names, if any, for `target`'s vocabulary (on the node that runs the
// worker, before it starts: a bad draft fails the spawn, naming its path).
worker_drafts load_worker_drafts(const worker_spec& spec, const served_model& target);
// Pipeline stages: wraps the worker's loaded model (its own layers) with the remote stages of
// `spec.pipeline`, connecting to them with the node's CURVE keys for curve:// stages (nothing
// without a pipeline). Throws naming the stage that cannot be used, which fails the spawn.
void attach_pipeline_stages(const worker_spec& spec, const kv_channel_keys& keys, served_model& served);
// Loads the plugins of `spec` that run the logits hook (none: null), on the worker's node before
// it starts: a library that cannot be loaded fails the spawn, naming it.
std::shared_ptr<plugin_chain> load_worker_logits_plugins(const worker_spec& spec);
// logits_plugins: run on the rows of the requests that name them (null: none loaded).
worker_handle::behavior_type worker_actor(worker_handle::pointer self, std::shared_ptr<served_model> served,
                                          worker_kv_settings kv = {}, worker_drafts drafts = {},
                                          std::shared_ptr<plugin_chain> logits_plugins = nullptr);

// The KV agent: an event-based actor beside the worker that never blocks (the worker does, while
// it computes), so transfers are set up while steps run. A shell over the instance's
// kv_connector (kvtransfer/kv_connector.hpp): it takes kv_expect_msg from its scheduler
// (answered with kv_ready_msg), kv_cancel_msg, kv_ready_msg from the router (for its sender) and
// (kv_leases_atom) → kv_lease_counts; the receiver's completions come back through it to the
// scheduler that reserved the transfer (kv_arrival_msg).
kv_agent_handle::behavior_type kv_agent_actor(kv_agent_handle::pointer self, std::shared_ptr<kv_connector> connector);

detokenizer_handle::behavior_type detokenizer_actor(detokenizer_handle::pointer self,
                                                    std::shared_ptr<detokenize_stage> stage, frontend_handle frontend);

// -- stages started from their specs (stages/stage_specs.hpp) -----------------------------------
// What a node registers for remote spawning and spawns for itself: each loads what its stage
// needs on the node where it runs, in the actor. A bad spec ends the actor with a reason naming
// the field. A failed load (a tokenizer or model path missing on that node) makes it a refused
// placement: it answers its placer's first question with the reason, then ends. Ending at once is
// not enough: CAF 0.17 tells a remote monitor of an actor that ended before the monitor arrived
// only "exit_reason(unknown)".
caf::behavior refused_placement(caf::scheduled_actor* self, const std::string& stage, const std::string& reason);
// The same for a typed stage: it answers whatever comes first with the reason, whatever its
// interface says it would answer (so it is built unchecked from the untyped refusal).
template <class... Sigs>
caf::typed_behavior<Sigs...> refused_placement(caf::typed_event_based_actor<Sigs...>* self, const std::string& stage,
                                               const std::string& reason) {
  return {typename caf::typed_behavior<Sigs...>::unsafe_init{},
          refused_placement(static_cast<caf::scheduled_actor*>(self), stage, reason)};
}

// Loads its own tokenizer (a pool spawned by one node shares one: node/stage_factories.hpp).
tokenizer_handle::behavior_type tokenizer_actor_from_spec(tokenizer_handle::pointer self, tokenizer_spec spec);
scheduler_handle::behavior_type scheduler_actor_from_spec(scheduler_handle::pointer self, scheduler_spec spec);
// Loads the model; spawn it detached (node/stage_factories.hpp does).
worker_handle::behavior_type worker_actor_from_spec(worker_handle::pointer self, worker_spec spec);
detokenizer_handle::behavior_type detokenizer_actor_from_spec(detokenizer_handle::pointer self, detokenizer_spec spec);

}  // namespace troupe
