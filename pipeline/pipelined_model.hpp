#pragma once
// A model cut into pipeline stages across processes (issue 27): the earlier stages run remotely
// (pipeline/stage_server.hpp), the last one here, where the engine samples. Everything but the
// layers' compute stays with the engine that drives it: the scheduler, block tables, sampling,
// drafts and grammars see one model; each forward's batch goes to the remote stages as arrays
// and comes back as the residual stream entering the local stage.
//
// A forward is cut into micro-batches (whole sequences each, about equal tokens) that flow
// through the stages one after another, so stage k computes micro-batch i + 1 while stage k + 1
// computes i, and the transfers overlap both (pipeline/stage_link.hpp).

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kvtransfer/kv_channel.hpp"
#include "model/layer_range.hpp"
#include "model/model.hpp"

namespace troupe {

// One remote stage: where its server listens and the layers it holds.
struct remote_stage {
  std::string endpoint;  // "kvtcp://HOST:PORT" or "curve://HOST:PORT/KEY" (pipeline/stage_channel.hpp)
  layer_range layers;
};

struct pipeline_settings;

// Where an engine's earlier layers run and how they are driven: the topology's [pipeline] and
// `troupe serve --pipeline-stage`, carried to the worker that loads the engine's own layers
// (the rest: engine_layers()).
struct pipeline_plan {
  std::vector<remote_stage> stages;  // in layer order from layer 0; empty: no pipeline
  int32_t micro_batches = 2;
  int32_t step_timeout_ms = 60000;
  int32_t connect_timeout_ms = 10000;
  // A lost stage's link is tried again after reconnect_first_delay_ms, the delay doubling up to
  // reconnect_max_delay_ms, at most reconnect_attempts times (about 4 minutes with these) before
  // it stays down and /health says it gave up.
  int32_t reconnect_first_delay_ms = 100;
  int32_t reconnect_max_delay_ms = 2000;
  int32_t reconnect_attempts = 120;
  // How long the engine's scheduler keeps the requests of a lost stage (and new ones) waiting
  // for it to come back, to run them again from their tokens; past it they fail naming the
  // stage. 0: they fail at once.
  int32_t failover_wait_ms = 30000;
  // A prefill/decode pair of pipelines cut at the same layers moves each stage's layers of KV
  // between the two instances' matching stages, a channel per pair (kvtransfer/kv_stage_pairs.hpp):
  // [pipeline] kv_stage_pairs (default true), in effect only when the cuts match (pipeline_for).
  bool kv_stage_pairs = false;

  bool empty() const { return stages.empty(); }
  // The layers the engine itself holds: from the last remote stage's end to the model's last.
  layer_range engine_layers() const {
    return stages.empty() ? layer_range{} : layer_range{stages.back().layers.end, 0};
  }
  // Throws std::runtime_error naming the bad field: endpoints that are not kvtcp://HOST:PORT,
  // stages that do not follow one another from layer 0, a micro-batch count, timeout, back-off
  // or failover wait out of range.
  void validate() const;
  // The link settings this plan asks for (keys aside).
  pipeline_settings settings() const;
};

// "kvtcp://HOST:PORT@FIRST-LAST", as `--pipeline-stage` takes it. Throws naming the text.
remote_stage parse_remote_stage(const std::string& text);

struct pipeline_settings {
  // Micro-batches per forward (at most one per sequence; 1 when a step asks for hidden rows).
  int micro_batches = 2;
  std::chrono::milliseconds connect_timeout{10000};
  // How long one micro-batch may take at one stage before the link is given up.
  std::chrono::milliseconds step_timeout{60000};
  // A lost stage's reconnection: the first retry after reconnect_first_delay, then doubling up to
  // reconnect_max_delay, at most reconnect_attempts tries (pipeline_plan has the keys).
  std::chrono::milliseconds reconnect_first_delay{100};
  std::chrono::milliseconds reconnect_max_delay{2000};
  int reconnect_attempts = 120;
  // The cluster's CURVE keys (this member's pair and the members'), for curve:// stages.
  kv_channel_keys keys;

  void validate() const;  // throws std::runtime_error naming the bad field
};

// Wraps `last_stage` (a model of the last layers, model/layer_range.hpp) with the remote stages
// before it, connecting to each now. `remote` must cover layers 0 .. last_layers.first - 1 in
// order. The model's KV pool is the smallest of the stages' (every stage holds its layers' KV in
// the same blocks). Throws std::runtime_error naming the stage and why it cannot be used.
std::unique_ptr<model> make_pipelined_model(std::unique_ptr<model> last_stage, layer_range last_layers,
                                            const std::vector<remote_stage>& remote, const pipeline_settings& settings);
// The same for a plan: the last stage holds plan.engine_layers(); `keys` for curve:// stages.
std::unique_ptr<model> make_pipelined_model(std::unique_ptr<model> last_stage, const pipeline_plan& plan,
                                            const kv_channel_keys& keys = {});

// The micro-batches of `batch`: contiguous runs of whole sequences of about equal tokens, at
// most `count` (never more than there are sequences), as [first sequence, end sequence) pairs.
std::vector<std::pair<int, int>> cut_micro_batches(const forward_batch& batch, int count);

// The arrays of sequences [first, end) of `batch` as a batch of their own (offsets from 0; no
// logits or hidden rows).
forward_batch slice_sequences(const forward_batch& batch, int first, int end);

}  // namespace troupe
