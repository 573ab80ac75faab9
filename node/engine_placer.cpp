#include "node/engine_placer.hpp"

#include <caf/make_message.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "node/stage_factories.hpp"
#include "stages/message_inspect.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

engine_placer::engine_placer(caf::actor_system& system, const topology& t, caf::actor owner)
    : system_(system), topology_(t), link_(system, t.cluster, std::move(owner)), keeper_([this] { keep(); }) {}

engine_placer::~engine_placer() { stop(); }

void engine_placer::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (keeper_.joinable()) keeper_.join();
}

scheduler_spec engine_placer::scheduler_for(const worker_description& description, worker_handle worker) const {
  // The worker's own pool and limits, the topology's budgets.
  engine_config config = description.config;
  config.max_num_batched_tokens = topology_.max_num_batched_tokens;
  config.max_num_seqs = topology_.model.max_num_seqs;
  config.max_waiting_requests = topology_.max_waiting_requests;
  config.async_scheduling = topology_.async_scheduling;
  config.scheduling_policy = topology_.scheduling_policy;
  config.slo_admission = topology_.slo_admission;
  config.num_speculative_tokens = topology_.speculative.num_draft_tokens;
  config.max_speculative_tokens = topology_.speculative.max_draft_tokens;
  config.validate();
  scheduler_spec spec{config, description.eos_token_ids, std::move(worker), router_};
  spec.kv_agent = description.kv_agent;
  spec.kv_transfer_timeout_ms = topology_.disaggregation.kv_transfer_timeout_ms;
  spec.pipeline_failover_wait_ms = topology_.pipeline.failover_wait_ms;
  return spec;
}

worker_spec engine_placer::worker_for(const std::string& node, engine_role role) const {
  worker_spec spec{topology_.model};
  const node_address* address = topology_.find_node(node);
  if (address && !address->kv_cache_dtype.empty()) spec.model.backend.kv_cache_dtype = address->kv_cache_dtype;
  // A worker receives KV on its node's own address, where the other nodes reach it.
  spec.kv_bind_host = address ? address->host : topology_.disaggregation.controller_kv_host;
  spec.kv_transfer_timeout_ms = topology_.disaggregation.kv_transfer_timeout_ms;
  spec.kv_transport = topology_.disaggregation.transport;
  spec.draft_model = topology_.speculative.draft_spec(spec.model);  // the draft's KV as the node's
  spec.ngram = topology_.speculative.ngram;
  spec.pipeline = topology_.pipeline_for(role);
  spec.plugins = topology_.plugins;
  spec.model.backend.layers = spec.pipeline.engine_layers();
  return spec;
}

placed_engine engine_placer::place(const std::string& node, engine_role role) {
  placed_engine placed;
  placed.node = node;
  placed.role = role;
  // The worker and its scheduler are built from their specs, here or on the node, the same way.
  const bool here = node == topology_.cluster.name;
  const node_address* address = here ? nullptr : topology_.find_node(node);
  if (!here && !address) throw std::runtime_error("no node named '" + node + "' in the topology's [[nodes]]");
  placed.worker =
      link_.spawn_on<worker_handle>(address, "worker", caf::make_message(worker_for(node, role)), &stopping_);
  try {
    // It answers once its model is loaded (or with why it could not be): here that takes what it
    // takes; another node must answer within request_timeout_ms.
    placed.description =
        here ? link_.ask_within<worker_description>(placed.worker, "the controller's own worker", caf::infinite,
                                                    describe_atom::value)
             : link_.ask<worker_description>(placed.worker, "the worker on node " + node, describe_atom::value);
    placed.scheduler = link_.spawn_on<scheduler_handle>(
        address, "scheduler", caf::make_message(scheduler_for(placed.description, placed.worker)), &stopping_);
  } catch (...) {
    caf::anon_send_exit(placed.worker, caf::exit_reason::user_shutdown);
    throw;
  }
  placed.id = link_.ask<engine_instance_id>(router_, "the router", engine_joined_atom::value, placed.scheduler,
                                            placed.worker, node, placed.description.kv_agent,
                                            std::string(engine_role_name(role)), placed.description.quantization);
  spdlog::info("engine instance {} on {} ({}): {}", placed.id, node, engine_role_name(role),
               placed.description.summary);
  return placed;
}

void engine_placer::place_again_later(const std::string& node, const std::string& kind) {
  if (kind != "tokenizer" && kind != "detokenizer" && node == topology_.cluster.name) return;
  {
    std::lock_guard lock(mutex_);
    lost_.emplace(kind, node);
  }
  wake_.notify_all();
}

void engine_placer::keep() {
  std::unique_lock lock(mutex_);
  std::pair<std::string, std::string> last_tried;  // (kind, node)
  while (!stopping_) {
    if (lost_.empty()) {
      wake_.wait(lock, [this] { return stopping_ || !lost_.empty(); });
      continue;
    }
    // Round robin over the lost stages: a try on a node still down waits out connect_timeout_ms,
    // and always trying the first one would keep a node that is back from ever being placed.
    const auto next = lost_.upper_bound(last_tried);
    const auto [kind, node] = next == lost_.end() ? *lost_.begin() : *next;
    last_tried = {kind, node};
    lock.unlock();
    bool placed = false;
    try {
      if (kind == "engine" || kind == "prefill" || kind == "decode") {
        place(node, kind == "engine" ? engine_role::mixed : parse_engine_role(kind));
      } else if (restore_) {
        restore_(kind, node);
      }
      placed = true;
      spdlog::info("{} on node {} is back", kind, node);
    } catch (const std::exception& e) {
      if (!stopping_) spdlog::debug("node {} not back yet: {}", node, e.what());
    }
    lock.lock();
    if (placed) {
      lost_.erase(lost_.find(std::make_pair(kind, node)));
    } else {
      // Wait before the next attempt (connect already waited out a refused connection).
      wake_.wait_for(lock, std::chrono::milliseconds(topology_.cluster.reconnect_interval_ms),
                     [this] { return stopping_.load(); });
    }
  }
}

}  // namespace troupe
