#pragma once
// What the server sends back on the ZeroMQ plane (docs/protocol.md).

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace troupe {

struct token_logprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // the n most likely tokens when asked for
};

// A prompt token's logprob (prompt_logprobs): given the prompt tokens before it.
struct prompt_logprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  int32_t rank = 0;                            // 1 + the number of tokens the model found more likely
  std::vector<std::pair<int32_t, float>> top;  // the n most likely tokens
};

// Speculative decoding's part in a request: sent only when the engine verified drafts for it.
struct speculative_usage {
  int draft_tokens = 0;          // draft tokens proposed and verified
  int accepted_tokens = 0;       // of those, the ones the model agreed with (kept as outputs)
  double acceptance_rate = 0.0;  // accepted_tokens / draft_tokens
  double tokens_per_step = 0.0;  // output tokens per engine step that sampled the request (1: no gain)
};

struct usage_info {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int num_preemptions = 0;  // times the request lost its KV blocks to others and was recomputed
  std::optional<speculative_usage> speculative = std::nullopt;  // present when drafts were verified
};

// Seconds. tpot is the mean time per output token after the first.
struct timing_info {
  double queue = 0.0;  // arrival -> first scheduled
  double ttft = 0.0;   // arrival -> first token
  double tpot = 0.0;
  double e2e = 0.0;  // arrival -> finish
};

// A piece of a completion; the last one carries finish_reason, usage and timings.
struct delta_reply {
  std::string id;
  std::string text;
  std::vector<int32_t> token_ids;
  std::optional<std::vector<token_logprob>> logprobs;
  std::optional<std::string> finish_reason;  // "stop", "length", "abort"
  std::optional<usage_info> usage;
  std::optional<timing_info> timings;
  // On the reply with the first token, when the request asked for prompt_logprobs: one per prompt
  // token after the first.
  std::optional<std::vector<prompt_logprob>> prompt_logprobs;
};

// The project's one error enum: the codes on the wire (by name, docs/protocol.md), the scheduler's
// refusals (engine/request_error.hpp) and the errors actors answer with (a CAF error category,
// stages/error_category.hpp). Numbered from 1: CAF reads an error with code 0 as no error.
enum class error_code : uint8_t {
  bad_request = 1,   // malformed frame, wrong type, unknown field, out-of-range value
  unauthorized,      // missing or wrong api_key
  prompt_too_long,   // prompt plus max_tokens cannot fit the context
  overloaded,        // the waiting queue is full
  slo_unattainable,  // the request's TTFT target cannot be met behind the queue (slo policy, reject admission)
  duplicate_id,      // a request with this id is still running for this client
  not_found,         // abort of an unknown id
  internal,          // the server failed; the request is gone
  unavailable,       // no engine instance can serve now (every one lost or draining): retry later
};

const char* error_code_name(error_code code);
std::optional<error_code> error_code_from_name(const std::string& name);
// The code numbered `value`, if any: a code read as a number (from another node) is checked here.
std::optional<error_code> error_code_from_value(int value);

struct error_reply {
  std::string id;  // empty when the request's id could not be read
  error_code code = error_code::bad_request;
  std::string message;
};

struct stats_reply {
  std::string id;
  int num_free_blocks = 0;
  int num_total_blocks = 0;
  int num_running = 0;
  int num_waiting = 0;
  int num_requests_in_flight = 0;  // requests the server holds in any stage
  // Disaggregation: requests whose blocks a decode instance reserved while their KV arrives,
  // and the KV transfers the instances hold open (both are 0 on an idle server).
  int num_waiting_for_kv = 0;
  int num_kv_leases = 0;
};

using server_reply = std::variant<delta_reply, error_reply, stats_reply>;

}  // namespace troupe
