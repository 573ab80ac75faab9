#pragma once
// Every message that travels between stages, one plain struct each. Their CAF `inspect`
// overloads, which let a message cross to another node, are in stages/message_inspect.hpp,
// included only by actors and nodes: the plain classes compile without CAF.
//
//   frontend ─tokenize_request▶ tokenizer ─schedule_request▶ scheduler ─step_plan▶ worker
//   worker ─step_done▶ scheduler ─token_batch▶ detokenizer ─text_batch▶ frontend
//   frontend ─abort_request_msg / stats_query▶ scheduler ─stats_answer▶ frontend
//   detokenizer ─stop_request_msg▶ scheduler (a stop string matched)
//   tokenizer, scheduler (a refusal), detokenizer (a failed step) ─request_failed▶ frontend
//   node ─stage_failure_drill▶ any stage (a debug drill: the stage fails)

#include <cstdint>
#include <string>
#include <vector>

#include "engine/kv_handoff.hpp"
#include "engine/step_plan.hpp"
#include "engine/token_delta.hpp"
#include "protocol/replies.hpp"
#include "protocol/requests.hpp"
#include "protocol/sampling_params.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

// rendered_chat: `prompt` is a chat the door already rendered with the model's chat template
// (it needs the rendered text to read the answer back: reasoning, tool calls); encoded like
// `messages`, the template having written BOS and the like itself.
enum class prompt_kind : uint8_t { text, token_ids, messages, rendered_chat };

struct tokenize_request {
  int64_t request_id = 0;
  prompt_kind kind = prompt_kind::text;
  std::string prompt;
  std::vector<int32_t> prompt_token_ids;
  std::vector<chat_message> messages;
  sampling_params sampling;
  int32_t priority = 0;
  service_targets targets;
};

struct schedule_request {
  int64_t request_id = 0;
  std::vector<int32_t> prompt_ids;
  sampling_params sampling;
  int32_t priority = 0;
  service_targets targets;      // tenant and latency targets (the fair and slo policies)
  duration_ns tokenize_ns = 0;  // the tokenizer's clock: request received -> prompt ids checked
  // Tokens this request already generated on an instance that was lost (and the client already
  // has): the re-run continues after them. Empty for a fresh request.
  std::vector<int32_t> resumed_output_ids;
  // Its half of a disaggregated pair, when the router split it (engine/kv_handoff.hpp).
  kv_handoff kv;
  // Which run of the request this is: the router counts them (0 the first, one more each time it
  // runs it again) and the scheduler stamps it on every delta, so that the router can drop what
  // an earlier run still sends (engine/token_delta.hpp).
  uint32_t attempt = 0;
};

// -- prefill/decode disaggregation (docs/design/cluster.md) ------------------------------------------
//   router ─schedule_request (kv send)▶ prefill scheduler; ─schedule_request (kv receive)▶ decode scheduler
//   decode scheduler ─kv_expect_msg▶ its KV agent ─(kv_ready_msg response)▶ decode scheduler ─▶ router
//   router ─kv_ready_msg▶ prefill KV agent (its sender may send); KV frames go on the data plane
//   decode KV agent ─kv_arrival_msg▶ decode scheduler; router ─kv_handover_msg▶ decode scheduler
//   decode scheduler ─kv_failed_msg▶ router (the request was dropped there: re-run it)
//   prefill KV agent ─kv_failed_msg▶ router (its sender gave the transfer up: re-run it now,
//                                     rather than leave the decode half waiting for its deadline)

// Decode scheduler -> its instance's KV agent: expect this transfer in these blocks until the
// deadline. Answered with the kv_ready_msg the prefill side needs.
struct kv_expect_msg {
  kv_reservation reservation;
  int32_t timeout_ms = 0;
};

// Where a transfer's frames go: the receiver's endpoint and CURVE key.
struct kv_ready_msg {
  int64_t request_id = 0;
  uint64_t transfer_id = 0;
  std::string endpoint;
  std::string public_key;
  // A device transport's destination (kv_transport "cuda_ipc" or "nccl"): the decode side's pool
  // (device_kv_pool_handle bytes for cuda_ipc; for nccl the pair's id and the pool's geometry,
  // nccl_pool_handle; at most max_kv_pool_handle_bytes) and the blocks it reserved
  // for tokens [0, num_tokens); the prefill side copies into them and sends in-place frames.
  // Both empty on zmq, whose frames carry the bytes.
  std::string kv_pool_handle;
  std::vector<int32_t> block_ids;
  // A pipelined decode instance's stages that take their layers' KV from the prefill's matching
  // stages themselves (kvtransfer/kv_stage_pairs.hpp), in order, each as kv_stage_route_text
  // (at most kv_stage_routes_max, each parsed when the message is read); empty: every layer comes
  // to `endpoint`.
  std::vector<std::string> stage_routes;
};

// KV agent -> its scheduler: the transfer's KV is in its blocks (ok), or will never be (why).
struct kv_arrival_msg {
  int64_t request_id = 0;
  uint64_t transfer_id = 0;
  bool ok = false;
  std::string why;
};

// Router -> decode scheduler: the tokens the prefill instance sampled (its handed-off delta).
struct kv_handover_msg {
  int64_t request_id = 0;
  uint64_t transfer_id = 0;
  std::vector<int32_t> token_ids;
};

// Decode scheduler -> router: the request's KV transfer failed and the request left this
// instance; the router runs it again or ends it with `why`. Also prefill KV agent -> router: its
// sender gave the transfer up (request_id 0: the sender knows transfers only).
struct kv_failed_msg {
  int64_t request_id = 0;
  uint64_t transfer_id = 0;
  std::string why;
};

// Decode scheduler -> its KV agent: stop expecting a transfer (the request ended or moved).
struct kv_cancel_msg {
  uint64_t transfer_id = 0;
};

// A KV agent's leases now (what must be zero on an idle instance).
struct kv_lease_counts {
  int32_t num_expected = 0;  // receiver: transfers whose blocks are reserved here
  int32_t num_sending = 0;   // sender: transfers with frames held or queued
  uint64_t num_refused_frames = 0;
};

// The worker's answer to a step_plan; `error` non-empty when the step failed.
struct step_done {
  step_result result;
  duration_ns compute_ns = 0;  // the worker's clock: plan received -> result ready
  std::string error;
  // The error is a lost pipeline stage's (model/stage_lost_error.hpp): the step's requests are
  // not at fault and run again once the stage is back, instead of failing with it.
  bool stage_lost = false;
};

// The per-request timeline the scheduler keeps; attached to a request's final delta. Durations
// only, each the difference of two readings of the one clock named: stages may run on different
// hosts, whose steady clocks have nothing in common, so no stamp crosses a stage.
struct request_timeline {
  duration_ns tokenize_ns = 0;            // tokenizer: request received -> prompt ids checked
  duration_ns queue_ns = 0;               // scheduler: request received -> first scheduled
  duration_ns first_step_done_ns = 0;     // scheduler: request received -> first step's result
  duration_ns last_step_done_ns = 0;      // scheduler: request received -> last step's result
  duration_ns first_step_compute_ns = 0;  // worker: its first step, plan received -> result ready
  int32_t num_steps = 0;
  // Disaggregated (the decode half's scheduler): request received -> blocks reserved for its KV,
  // and -> the whole KV landed; 0 for a request computed whole on one instance.
  duration_ns kv_reserved_ns = 0;
  duration_ns kv_landed_ns = 0;
  int32_t instance = -1;  // the router's id of the engine instance that ended it; -1: not known
};

struct request_failed {
  int64_t request_id = 0;
  error_code code = error_code::internal;
  std::string message;
};

// An engine instance's occupancy when its scheduler sent a token batch, for the router.
struct engine_load {
  int32_t num_free_blocks = 0;
  int32_t num_total_blocks = 0;  // 0: no report yet
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  // What a prompt token costs there, by its step-time model (engine/step_time_model.hpp); 0 until
  // it has measured enough steps. The router weighs each instance's queue by it, so a slower
  // instance's queue counts for more.
  double seconds_per_prompt_token = 0;
};

// One step's deltas, for the detokenizer. timelines[i] is set for finished deltas[i]. A request
// the step ended in error has no final delta: it comes in `failures`, after the deltas, so the
// detokenizer drops its state before it tells the frontend.
struct token_batch {
  std::vector<token_delta> deltas;
  std::vector<request_timeline> timelines;  // [deltas.size()]
  std::vector<request_failed> failures;
  engine_load load;  // the sending instance's, after the step (the router reads it)

  bool empty() const { return deltas.empty() && failures.empty(); }
};

struct text_delta {
  token_delta delta;
  std::string text;
  request_timeline timeline;  // meaningful when delta.finished()
};

struct text_batch {
  std::vector<text_delta> deltas;
};

struct abort_request_msg {
  int64_t request_id = 0;
  // From the router, dropping one half of a disaggregated request it runs again: the request
  // ends here without a word (no final delta; nothing kept as an early abort, since the id's
  // next run may come here next).
  bool quietly = false;
};

// From the detokenizer: the request's text matched a stop string. The scheduler finishes it and
// frees its blocks; the client still gets exactly one final delta, from the detokenizer.
struct stop_request_msg {
  int64_t request_id = 0;
};

// A failure drill (node::fail_stage): the stage that receives it throws `reason` from its
// handler, exactly as a bug would, so the node's handling of a failed stage can be exercised on a
// live node. Never sent in normal serving.
struct stage_failure_drill {
  std::string reason;
};

struct stats_query {
  uint64_t tag = 0;
};

// One instance's step-time model (engine/step_time_model.hpp), for /metrics.
struct step_model_report {
  int32_t instance = 0;              // set by the router
  std::string role = "mixed";        // the instance's: mixed, prefill or decode (set by the router)
  std::vector<double> coefficients;  // [5] seconds per: step, token, sequence, context token, attention pair
  double token_floor = 1;            // the token feature is max(new tokens, this)
  double min_step_s = 0;             // no step is predicted faster (the fastest measured)
  double rms_error_s = 0;            // of the fit over the steps it holds
  int64_t num_steps = 0;             // steps measured in all
};

// The CPU one process has spent since it began serving (engine/process_cpu.hpp), from a
// scheduler's answer: a disaggregated cluster's nodes each run a serving stack of their own
// (scheduler, KV agent, KV sender and receiver) on cores a plan may share.
struct process_cpu_report {
  std::string process;  // "host:pid": one entry per process however many instances it holds
  double total_s = 0;
  double compute_s = 0;  // the model's steps
};

struct stats_answer {
  uint64_t tag = 0;
  int32_t num_free_blocks = 0;
  int32_t num_total_blocks = 0;
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  // Non-empty when the node cannot answer because a stage has failed (the reason, e.g. "the node
  // is out of service: the scheduler stage failed: ..."); the counts are then meaningless.
  std::string unavailable;
  int32_t num_waiting_for_kv = 0;  // decode side: blocks reserved, KV arriving
  int32_t num_kv_leases = 0;       // the KV agents' open transfers, both directions
  // Requests refused at once because their TTFT target could not be met (slo_admission reject).
  int64_t num_slo_rejections = 0;
  std::vector<step_model_report> step_models;  // one per instance that answered
  std::vector<process_cpu_report> processes;   // the processes of the instances that answered
  // A pipelined engine's stages and each one's busy share of the last 10 s, "0-3:41.2%,4-7:38.0%"
  // (pipeline/stage_load.hpp); "" for an engine that is not a pipeline.
  std::string pipeline_busy;
  // Requests the router refused at once because every decode instance was behind (pair
  // admission, stages/engine_router.hpp); set by the router on its summed answer.
  int64_t num_overload_refusals = 0;
};

}  // namespace troupe
