#pragma once
// What a node needs to start one stage, as plain data that travels in a message: a controller
// remote-spawns a stage on another node from its spec (node/remote_node.hpp), and the colocated
// node spawns its own stages from the same specs (stages/stage_factories.hpp). A spec names files
// to load, never loaded objects, so the node that runs the stage loads only what the stage needs
// (a tokenizer node maps no weights). Every actor a stage sends to travels inside the spec as a
// typed actor handles (stages/stage_interfaces.hpp; CAF serializes a handle as its node and id, a
// proxy on the far side): no pointers.
// Their CAF inspect overloads are in stages/message_inspect.hpp.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <caf/actor.hpp>

#include "engine/engine_config.hpp"
#include "engine/ngram_proposer.hpp"
#include "engine/served_model.hpp"
#include "kvtransfer/kv_channel.hpp"
#include "kvtransfer/kv_transport.hpp"
#include "pipeline/pipelined_model.hpp"
#include "plugins/plugin_spec.hpp"
#include "stages/stage_interfaces.hpp"

namespace troupe {

// A tokenizer stage: prompts in (tokenize_request), checked prompt ids out to the scheduler.
struct tokenizer_spec {
  std::string tokenizer_path;        // a model path (HF directory, .gguf, config.json) or a tokenizer.json's folder
  int vocab_size = 0;                // prompt ids must be below it: the model's, not the tokenizer's
  int max_model_len = 0;             // prompts must leave room for at least one generated token
  router_handle router;              // where checked requests go (schedule_request): the controller's router
  frontend_handle reply_to;          // where refusals go (request_failed): the doors' actor
  std::vector<plugin_spec> plugins;  // their request hooks run on each prompt (include/troupe/plugin.h)

  // Throws std::runtime_error naming the first field a stage could not start with.
  void validate() const {
    for (const plugin_spec& plugin : plugins) troupe::validate(plugin);
    if (tokenizer_path.empty()) throw std::runtime_error("tokenizer_spec: tokenizer_path is empty");
    if (vocab_size <= 0)
      throw std::runtime_error("tokenizer_spec: vocab_size must be positive, got " + std::to_string(vocab_size));
    if (max_model_len <= 0) {
      throw std::runtime_error("tokenizer_spec: max_model_len must be positive, got " + std::to_string(max_model_len));
    }
    if (!router) throw std::runtime_error("tokenizer_spec: no router to send requests to");
    if (!reply_to) throw std::runtime_error("tokenizer_spec: no reply_to actor for refusals");
  }
};

// A worker stage: loads the model the spec names on the node it runs on, runs step plans.
struct worker_spec {
  model_spec model;
  // The KV data plane (prefill/decode disaggregation): the host its receiver binds on (the
  // node's own address: prefill instances on other hosts connect there) and how long a
  // transfer may take before both sides give up its blocks.
  std::string kv_bind_host = "127.0.0.1";
  int32_t kv_transfer_timeout_ms = 10000;
  // [disaggregation] kv_transport: checked where the worker starts (the node that owns the GPU).
  troupe::kv_transport kv_transport = troupe::kv_transport::zmq;
  // Speculative decoding ([speculative]): the draft model the worker loads beside its model
  // (empty path: none), else the n-gram prompt lookup's settings.
  model_spec draft_model;
  ngram_settings ngram;
  // Pipeline stages (issue 27): the model's earlier layers on remote stage servers; the worker
  // loads the rest (model.backend.layers is pipeline.engine_layers()) and drives them.
  pipeline_plan pipeline;
  // The server's plugins: the worker loads those that run the logits hook and runs them on the
  // rows of the requests that name them (sampling_params::logits_plugins).
  std::vector<plugin_spec> plugins;
  // The node's own CURVE keys, filled in where the worker is spawned, never sent: the secret key
  // stays on its node (the inspect overload leaves it out).
  kv_channel_keys kv_keys;
};

// A scheduler stage: loads nothing; plans steps for `worker`, hands tokens and refusals to the
// controller's router. With the worker it makes one engine instance.
struct scheduler_spec {
  engine_config config;  // block count and size must match the worker's KV pool (its description)
  std::vector<int32_t> eos_token_ids;
  worker_handle worker;
  router_handle router;
  kv_agent_handle kv_agent;                // the worker's (worker_description::kv_agent)
  int32_t kv_transfer_timeout_ms = 10000;  // a reserved transfer's deadline
  // A pipelined engine: how long requests wait for a lost stage (pipeline_plan::failover_wait_ms).
  int32_t pipeline_failover_wait_ms = 30000;

  // Throws std::runtime_error naming the first field a stage could not start with.
  void validate() const {
    config.validate();
    if (pipeline_failover_wait_ms < 0) {
      throw std::runtime_error("scheduler_spec: pipeline_failover_wait_ms must be 0 or more, got " +
                               std::to_string(pipeline_failover_wait_ms));
    }
    if (!worker) throw std::runtime_error("scheduler_spec: no worker to send step plans to");
    if (!router) throw std::runtime_error("scheduler_spec: no router to send tokens to");
    if (!kv_agent) throw std::runtime_error("scheduler_spec: no KV agent for disaggregated requests");
    if (kv_transfer_timeout_ms <= 0) {
      throw std::runtime_error("scheduler_spec: kv_transfer_timeout_ms must be positive, got " +
                               std::to_string(kv_transfer_timeout_ms));
    }
  }
};

// A detokenizer stage: token deltas in, text deltas out to `reply_to`.
struct detokenizer_spec {
  std::string tokenizer_path;        // as in tokenizer_spec
  frontend_handle reply_to;          // text batches and failed requests: the doors' actor
  std::vector<plugin_spec> plugins;  // their output hooks run on each delta's text

  // Throws std::runtime_error naming the first field a stage could not start with.
  void validate() const {
    for (const plugin_spec& plugin : plugins) troupe::validate(plugin);
    if (tokenizer_path.empty()) throw std::runtime_error("detokenizer_spec: tokenizer_path is empty");
    if (!reply_to) throw std::runtime_error("detokenizer_spec: no reply_to actor for text");
  }
};

}  // namespace troupe
