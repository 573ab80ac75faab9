#pragma once
// The one list of every message type that crosses stages, with the name it is registered under.
// node/node.cpp registers exactly these with CAF, and tests/stages/message_serialization_test.cpp
// round-trips exactly these through CAF's binary serializer: a type added here is both
// registered and tested, and one left out is neither. The stage specs (and the settings inside
// them) are on it too: a controller sends them to spawn a stage on another node.

#include <type_traits>

#include "stages/messages.hpp"
#include "stages/stage_interfaces.hpp"
#include "stages/stage_specs.hpp"
#include "stages/trace_messages.hpp"

namespace troupe {

// Calls f(std::type_identity<T>{}, "name") for each message type T, in registration order.
template <class F>
void for_each_message_type(F&& f) {
  f(std::type_identity<chat_message>{}, "chat_message");
  f(std::type_identity<sampling_params>{}, "sampling_params");
  f(std::type_identity<scheduled_sequence>{}, "scheduled_sequence");
  f(std::type_identity<step_plan>{}, "step_plan");
  f(std::type_identity<sampled_token>{}, "sampled_token");
  f(std::type_identity<step_result>{}, "step_result");
  f(std::type_identity<token_logprobs>{}, "token_logprobs");
  f(std::type_identity<prompt_token_logprob>{}, "prompt_token_logprob");
  f(std::type_identity<request_metrics>{}, "request_metrics");
  f(std::type_identity<token_delta>{}, "token_delta");
  f(std::type_identity<tokenize_request>{}, "tokenize_request");
  f(std::type_identity<schedule_request>{}, "schedule_request");
  f(std::type_identity<step_done>{}, "step_done");
  f(std::type_identity<request_timeline>{}, "request_timeline");
  f(std::type_identity<engine_load>{}, "engine_load");
  f(std::type_identity<token_batch>{}, "token_batch");
  f(std::type_identity<text_delta>{}, "text_delta");
  f(std::type_identity<text_batch>{}, "text_batch");
  f(std::type_identity<abort_request_msg>{}, "abort_request_msg");
  f(std::type_identity<stop_request_msg>{}, "stop_request_msg");
  f(std::type_identity<detokenizer_resume_msg>{}, "detokenizer_resume_msg");
  f(std::type_identity<stage_failure_drill>{}, "stage_failure_drill");
  f(std::type_identity<stats_query>{}, "stats_query");
  f(std::type_identity<stats_answer>{}, "stats_answer");
  f(std::type_identity<request_failed>{}, "request_failed");
  f(std::type_identity<kv_handoff>{}, "kv_handoff");
  f(std::type_identity<kv_reservation>{}, "kv_reservation");
  f(std::type_identity<kv_expect_msg>{}, "kv_expect_msg");
  f(std::type_identity<kv_ready_msg>{}, "kv_ready_msg");
  f(std::type_identity<kv_arrival_msg>{}, "kv_arrival_msg");
  f(std::type_identity<kv_handover_msg>{}, "kv_handover_msg");
  f(std::type_identity<kv_failed_msg>{}, "kv_failed_msg");
  f(std::type_identity<kv_cancel_msg>{}, "kv_cancel_msg");
  f(std::type_identity<kv_lease_counts>{}, "kv_lease_counts");

  f(std::type_identity<step_event>{}, "step_event");
  f(std::type_identity<trace_query>{}, "trace_query");
  f(std::type_identity<trace_instance>{}, "trace_instance");
  f(std::type_identity<trace_answer>{}, "trace_answer");
  // The enums inside them (load_format, device_request, dtype) travel as fields, never alone.
  f(std::type_identity<backend_options>{}, "backend_options");
  f(std::type_identity<model_spec>{}, "model_spec");
  f(std::type_identity<engine_config>{}, "engine_config");
  f(std::type_identity<tokenizer_spec>{}, "tokenizer_spec");
  f(std::type_identity<worker_spec>{}, "worker_spec");
  f(std::type_identity<worker_description>{}, "worker_description");
  f(std::type_identity<scheduler_spec>{}, "scheduler_spec");
  f(std::type_identity<detokenizer_spec>{}, "detokenizer_spec");
  f(std::type_identity<service_targets>{}, "service_targets");
  f(std::type_identity<step_model_report>{}, "step_model_report");
  f(std::type_identity<process_cpu_report>{}, "process_cpu_report");
  // Engine instance ids in an answer that crosses to `troupe scale` (drain_node_atom).
  f(std::type_identity<std::vector<int32_t>>{}, "std::vector<int32_t>");
  // The typed stage handles and lists that travel as message elements (the router's
  // engine_joined_atom, set_detokenizers_atom and the frontend's delivered_tokens_atom): named, so
  // every stage interface (stages/stage_interfaces.hpp) renders with readable names.
  f(std::type_identity<scheduler_handle>{}, "scheduler_handle");
  f(std::type_identity<worker_handle>{}, "worker_handle");
  f(std::type_identity<kv_agent_handle>{}, "kv_agent_handle");
  f(std::type_identity<detokenizer_handle>{}, "detokenizer_handle");
  f(std::type_identity<std::vector<detokenizer_handle>>{}, "std::vector<detokenizer_handle>");
  f(std::type_identity<std::vector<int64_t>>{}, "std::vector<int64_t>");
}

}  // namespace troupe
