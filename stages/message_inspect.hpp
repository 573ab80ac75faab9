#pragma once
// CAF `inspect` overloads for every message in stages/messages.hpp and the engine types they
// carry, so that CAF can serialize them and any stage can live on another node. Included only by
// actors and nodes. Every type here is registered by name in node/node.cpp and round-trips
// CAF's binary serializer in tests/stages/message_serialization_test.cpp.

#include <bit>
#include <cstdint>
#include <vector>

#include <caf/error.hpp>
#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>

#include "kvtransfer/device_kv_copier.hpp"
#include "kvtransfer/kv_stage_pairs.hpp"
#include "stages/detokenizer_resume.hpp"
#include "stages/error_category.hpp"
#include "stages/messages.hpp"
#include "stages/stage_specs.hpp"
#include "stages/trace_messages.hpp"

namespace troupe {

// -- floats as bit patterns ----------------------------------------------------------------------
// CAF 0.17's binary serializer packs floats with its own IEEE-754 routine (detail::pack754),
// which does not keep subnormals (top_p 1e-45 arrived on another node as -1.6e32) nor NaN
// payloads. Every float and double in a message therefore travels as its bit pattern, so a value
// any door accepted reaches every node unchanged.

struct exact_float {
  float& value;
};
struct exact_double {
  double& value;
};
struct exact_floats {
  std::vector<float>& values;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exact_float& x) {
  uint32_t bits = std::bit_cast<uint32_t>(x.value);
  return f(bits, caf::meta::load_callback([&]() -> caf::error {
             x.value = std::bit_cast<float>(bits);
             return caf::none;
           }));
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exact_double& x) {
  uint64_t bits = std::bit_cast<uint64_t>(x.value);
  return f(bits, caf::meta::load_callback([&]() -> caf::error {
             x.value = std::bit_cast<double>(bits);
             return caf::none;
           }));
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exact_floats& x) {
  std::vector<uint32_t> bits(x.values.size());
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = std::bit_cast<uint32_t>(x.values[i]);
  return f(bits, caf::meta::load_callback([&]() -> caf::error {
             x.values.resize(bits.size());
             for (size_t i = 0; i < bits.size(); ++i) x.values[i] = std::bit_cast<float>(bits[i]);
             return caf::none;
           }));
}

// -- inspect overloads ----------------------------------------------------------------------------

// std::optional has no inspect in CAF 0.17: optional fields travel as a flag and a value,
// restored by a load callback.

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chat_message& x) {
  return f(caf::meta::type_name("chat_message"), x.role, x.content);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_bias& x) {
  return f(caf::meta::type_name("token_bias"), x.token_id, exact_float{x.bias});
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampling_params& x) {
  bool has_seed = x.seed.has_value();
  uint64_t seed = x.seed.value_or(0);
  auto guided_kind_value = static_cast<uint8_t>(x.guided.kind);
  auto pooling_value = static_cast<uint8_t>(x.pooling);
  return f(caf::meta::type_name("sampling_params"), exact_float{x.temperature}, x.top_k, exact_float{x.top_p},
           exact_float{x.min_p}, exact_float{x.repetition_penalty}, exact_float{x.presence_penalty},
           exact_float{x.frequency_penalty}, has_seed, seed, x.max_tokens, x.stop_token_ids, x.stop, x.ignore_eos,
           x.logprobs, x.prompt_logprobs, guided_kind_value, x.guided.source, x.guided.choices,
           x.num_speculative_tokens, x.logit_bias, x.skip_special_tokens, pooling_value, x.normalize_embedding,
           x.logits_plugins, caf::meta::load_callback([&]() -> caf::error {
             if (has_seed)
               x.seed = seed;
             else
               x.seed.reset();
             x.guided.kind = static_cast<guided_kind>(guided_kind_value);
             x.pooling = static_cast<pooling_kind>(pooling_value);
             return caf::none;
           }));
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, scheduled_sequence& x) {
  bool has_params = x.params.has_value();
  sampling_params params = x.params.value_or(sampling_params{});
  return f(caf::meta::type_name("scheduled_sequence"), x.request_id, x.num_computed_tokens, x.new_token_ids,
           x.input_from_previous_sample, x.block_table_start, x.block_table, x.sample, x.output_index, has_params,
           params, x.penalty_token_ids, x.num_prompt_tokens, x.kv_send_transfer_id, x.num_draft_slots, x.speculative,
           caf::meta::load_callback([&]() -> caf::error {
             if (has_params)
               x.params = std::move(params);
             else
               x.params.reset();
             return caf::none;
           }));
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_plan& x) {
  return f(caf::meta::type_name("step_plan"), x.step_id, x.sequences, x.preempted_ids, x.finished_ids);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampled_token& x) {
  return f(caf::meta::type_name("sampled_token"), x.request_id, x.token_id, exact_float{x.logprob}, x.top_token_ids,
           exact_floats{x.top_logprobs}, x.num_drafts, exact_floats{x.embedding}, x.prompt_logprobs);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, failed_request& x) {
  return f(caf::meta::type_name("failed_request"), x.request_id, x.why);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_result& x) {
  return f(caf::meta::type_name("step_result"), x.step_id, x.tokens, x.failed);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_logprobs& x) {
  return f(caf::meta::type_name("token_logprobs"), exact_float{x.logprob}, x.top_token_ids,
           exact_floats{x.top_logprobs});
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prompt_token_logprob& x) {
  return f(caf::meta::type_name("prompt_token_logprob"), x.token_id, exact_float{x.logprob}, x.rank, x.top_token_ids,
           exact_floats{x.top_logprobs});
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_metrics& x) {
  return f(caf::meta::type_name("request_metrics"), exact_double{x.queue_time}, exact_double{x.ttft},
           exact_double{x.tpot}, exact_double{x.e2e}, x.num_prompt_tokens, x.num_output_tokens, x.num_cached_tokens,
           x.num_preemptions, x.num_draft_tokens, x.num_accepted_tokens, x.num_sampling_steps);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_delta& x) {
  bool has_metrics = x.metrics.has_value();
  request_metrics metrics = x.metrics.value_or(request_metrics{});
  return f(caf::meta::type_name("token_delta"), x.request_id, x.token_ids, x.logprobs, x.finish, x.handed_off,
           x.kv_transfer_id, has_metrics, metrics, x.stop, x.skip_special_tokens, exact_floats{x.embedding},
           x.prompt_logprobs, x.attempt, caf::meta::load_callback([&]() -> caf::error {
             if (has_metrics)
               x.metrics = metrics;
             else
               x.metrics.reset();
             return caf::none;
           }));
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, service_targets& x) {
  return f(caf::meta::type_name("service_targets"), x.tenant, x.ttft_ms, x.tpot_ms);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tokenize_request& x) {
  return f(caf::meta::type_name("tokenize_request"), x.request_id, x.kind, x.prompt, x.prompt_token_ids, x.messages,
           x.sampling, x.priority, x.targets);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, schedule_request& x) {
  return f(caf::meta::type_name("schedule_request"), x.request_id, x.prompt_ids, x.sampling, x.priority, x.targets,
           x.tokenize_ns, x.resumed_output_ids, x.kv, x.attempt);
}
// A peer name comes from another node: bounded before anyone keys a communicator by it.
inline caf::error check_kv_peer(const char* message, const std::string& peer) {
  if (peer.size() <= max_kv_peer_bytes) return caf::none;
  return caf::make_error(error_code::bad_request, std::string(message) + ": a peer of " + std::to_string(peer.size()) +
                                                      " bytes, at most " + std::to_string(max_kv_peer_bytes));
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_handoff& x) {
  return f(caf::meta::type_name("kv_handoff"), x.role, x.transfer_id, x.peer,
           caf::meta::load_callback([&]() -> caf::error { return check_kv_peer("kv_handoff", x.peer); }));
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_reservation& x) {
  return f(caf::meta::type_name("kv_reservation"), x.request_id, x.transfer_id, x.block_ids, x.num_tokens, x.peer,
           caf::meta::load_callback([&]() -> caf::error { return check_kv_peer("kv_reservation", x.peer); }));
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_expect_msg& x) {
  return f(caf::meta::type_name("kv_expect_msg"), x.reservation, x.timeout_ms);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_ready_msg& x) {
  // The handle comes from another node: refused when it cannot be one, before anyone opens it.
  return f(caf::meta::type_name("kv_ready_msg"), x.request_id, x.transfer_id, x.endpoint, x.public_key,
           x.kv_pool_handle, x.block_ids, x.stage_routes, caf::meta::load_callback([&]() -> caf::error {
             if (x.kv_pool_handle.size() > max_kv_pool_handle_bytes) {
               return caf::make_error(error_code::bad_request,
                                      "kv_ready_msg: a kv_pool_handle of " + std::to_string(x.kv_pool_handle.size()) +
                                          " bytes, at most " + std::to_string(max_kv_pool_handle_bytes));
             }
             if (x.stage_routes.size() > kv_stage_routes_max) {
               return caf::make_error(error_code::bad_request,
                                      "kv_ready_msg: " + std::to_string(x.stage_routes.size()) +
                                          " stage routes, at most " + std::to_string(kv_stage_routes_max));
             }
             for (const std::string& route : x.stage_routes) {
               try {
                 (void)parse_kv_stage_route(route);
               } catch (const std::invalid_argument& e) {
                 return caf::make_error(error_code::bad_request, std::string("kv_ready_msg: ") + e.what());
               }
             }
             return caf::none;
           }));
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_arrival_msg& x) {
  return f(caf::meta::type_name("kv_arrival_msg"), x.request_id, x.transfer_id, x.ok, x.why);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_handover_msg& x) {
  return f(caf::meta::type_name("kv_handover_msg"), x.request_id, x.transfer_id, x.token_ids);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_failed_msg& x) {
  return f(caf::meta::type_name("kv_failed_msg"), x.request_id, x.transfer_id, x.why);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_cancel_msg& x) {
  return f(caf::meta::type_name("kv_cancel_msg"), x.transfer_id);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_lease_counts& x) {
  return f(caf::meta::type_name("kv_lease_counts"), x.num_expected, x.num_sending, x.num_refused_frames);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_done& x) {
  return f(caf::meta::type_name("step_done"), x.result, x.compute_ns, x.error, x.stage_lost);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_timeline& x) {
  return f(caf::meta::type_name("request_timeline"), x.tokenize_ns, x.queue_ns, x.first_step_done_ns,
           x.last_step_done_ns, x.first_step_compute_ns, x.num_steps, x.kv_reserved_ns, x.kv_landed_ns, x.instance);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_load& x) {
  return f(caf::meta::type_name("engine_load"), x.num_free_blocks, x.num_total_blocks, x.num_running, x.num_waiting,
           x.seconds_per_prompt_token);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_batch& x) {
  return f(caf::meta::type_name("token_batch"), x.deltas, x.timelines, x.failures, x.load);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, text_delta& x) {
  return f(caf::meta::type_name("text_delta"), x.delta, x.text, x.timeline);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, text_batch& x) {
  return f(caf::meta::type_name("text_batch"), x.deltas);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, abort_request_msg& x) {
  return f(caf::meta::type_name("abort_request_msg"), x.request_id, x.quietly);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stop_request_msg& x) {
  return f(caf::meta::type_name("stop_request_msg"), x.request_id);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, detokenizer_resume_msg& x) {
  return f(caf::meta::type_name("detokenizer_resume_msg"), x.request_id, x.stop, x.skip_special_tokens, x.spelled_ids);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_failure_drill& x) {
  return f(caf::meta::type_name("stage_failure_drill"), x.reason);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stats_query& x) {
  return f(caf::meta::type_name("stats_query"), x.tag);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stats_answer& x) {
  return f(caf::meta::type_name("stats_answer"), x.tag, x.num_free_blocks, x.num_total_blocks, x.num_running,
           x.num_waiting, x.unavailable, x.num_waiting_for_kv, x.num_kv_leases, x.num_slo_rejections, x.step_models,
           x.processes, x.pipeline_busy, x.num_overload_refusals);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, process_cpu_report& x) {
  return f(caf::meta::type_name("process_cpu_report"), x.process, x.total_s, x.compute_s);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_model_report& x) {
  return f(caf::meta::type_name("step_model_report"), x.instance, x.role, x.coefficients, x.token_floor, x.min_step_s,
           x.rms_error_s, x.num_steps);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_failed& x) {
  // The code travels as its number and is checked as it is read: a client gets a code it knows.
  auto code = static_cast<uint8_t>(x.code);
  return f(caf::meta::type_name("request_failed"), x.request_id, code, x.message,
           caf::meta::load_callback([&]() -> caf::error {
             const std::optional<error_code> known = error_code_from_value(code);
             if (!known) {
               return caf::make_error(error_code::bad_request, "request_failed: error code " + std::to_string(code) +
                                                                   " is not one the wire knows");
             }
             x.code = *known;
             return caf::none;
           }));
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_event& x) {
  return f(caf::meta::type_name("step_event"), x.instance, x.step_id, x.age_ns, x.elapsed_ns, x.compute_ns,
           x.num_prefill_sequences, x.num_decode_sequences, x.num_prefill_tokens, x.num_decode_tokens, x.request_ids);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, trace_query& x) {
  return f(caf::meta::type_name("trace_query"), x.tag, x.window_ns);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, trace_instance& x) {
  return f(caf::meta::type_name("trace_instance"), x.instance, x.node, x.clock_error_ns);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, trace_answer& x) {
  return f(caf::meta::type_name("trace_answer"), x.tag, x.steps, x.instances, x.unavailable);
}

// -- stage specs and the settings they carry (stages/stage_specs.hpp) -----------------------------
// Enums (load_format, device_request, dtype) travel as their underlying integers.

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, layer_range& x) {
  return f(caf::meta::type_name("layer_range"), x.first, x.end);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, backend_options& x) {
  return f(caf::meta::type_name("backend_options"), x.threads, exact_float{x.gpu_memory_utilization}, x.cuda_dtype,
           x.nano_batches, x.kv_cache_dtype, x.layers);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, model_spec& x) {
  return f(caf::meta::type_name("model_spec"), x.path, x.format, x.device, x.backend, x.block_size, x.num_kv_blocks,
           x.kv_memory_mb, x.max_model_len, x.max_num_seqs, x.memory_budget_mb);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_config& x) {
  auto policy = static_cast<uint8_t>(x.scheduling_policy);
  auto admission = static_cast<uint8_t>(x.slo_admission);
  return f(caf::meta::type_name("engine_config"), x.block_size, x.num_kv_blocks, x.max_num_batched_tokens,
           x.max_num_seqs, x.max_waiting_requests, x.max_model_len, x.enable_prefix_caching, x.async_scheduling,
           x.vocab_size, x.hidden_size, x.num_speculative_tokens, x.max_speculative_tokens, x.kv_window, policy,
           admission, caf::meta::load_callback([&]() -> caf::error {
             if (policy > static_cast<uint8_t>(scheduling_policy_kind::fair) ||
                 admission > static_cast<uint8_t>(slo_admission_mode::reject)) {
               return caf::make_error(error_code::bad_request, "engine_config: scheduling policy " +
                                                                   std::to_string(policy) + " / slo admission " +
                                                                   std::to_string(admission) +
                                                                   " is not one the engine knows");
             }
             x.scheduling_policy = static_cast<scheduling_policy_kind>(policy);
             x.slo_admission = static_cast<slo_admission_mode>(admission);
             return caf::none;
           }));
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ngram_settings& x) {
  return f(caf::meta::type_name("ngram_settings"), x.min_n, x.max_n, x.max_lookback);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, plugin_spec& x) {
  return f(caf::meta::type_name("plugin_spec"), x.name, x.library, x.config_json, x.hooks, x.budget_ms);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tokenizer_spec& x) {
  return f(caf::meta::type_name("tokenizer_spec"), x.tokenizer_path, x.vocab_size, x.max_model_len, x.router,
           x.reply_to, x.plugins);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, remote_stage& x) {
  return f(caf::meta::type_name("remote_stage"), x.endpoint, x.layers);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pipeline_plan& x) {
  return f(caf::meta::type_name("pipeline_plan"), x.stages, x.micro_batches, x.step_timeout_ms, x.connect_timeout_ms,
           x.reconnect_first_delay_ms, x.reconnect_max_delay_ms, x.reconnect_attempts, x.failover_wait_ms,
           x.kv_stage_pairs);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_spec& x) {
  auto transport = static_cast<uint8_t>(x.kv_transport);
  return f(caf::meta::type_name("worker_spec"), x.model, x.kv_bind_host, x.kv_transfer_timeout_ms, x.draft_model,
           x.ngram, x.pipeline, transport, x.plugins, caf::meta::load_callback([&]() -> caf::error {
             if (transport > static_cast<uint8_t>(kv_transport::nccl)) {
               return caf::make_error(error_code::bad_request,
                                      "worker_spec: kv_transport " + std::to_string(transport) + " is not a transport");
             }
             x.kv_transport = static_cast<troupe::kv_transport>(transport);
             return caf::none;
           }));
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_description& x) {
  return f(caf::meta::type_name("worker_description"), x.config, x.eos_token_ids, x.summary, x.quantization,
           x.kv_agent);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, scheduler_spec& x) {
  return f(caf::meta::type_name("scheduler_spec"), x.config, x.eos_token_ids, x.worker, x.router, x.kv_agent,
           x.kv_transfer_timeout_ms, x.pipeline_failover_wait_ms);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, detokenizer_spec& x) {
  return f(caf::meta::type_name("detokenizer_spec"), x.tokenizer_path, x.reply_to, x.plugins);
}

}  // namespace troupe
