#pragma once
// What a request asks of the sampler and of the stopping rules, and the one check of its values
// that both doors (ZeroMQ and HTTP) run once they have read them: whichever door a request comes
// through, the same values get the same verdict. The doors check only the wire format (types,
// unknown fields); the value rules live here and in docs/protocol.md ("Sampling rules").

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "protocol/protocol_limits.hpp"

namespace troupe {

// Structured output: what the whole output must match (grammar/ compiles it into an automaton).
enum class guided_kind : uint8_t { none = 0, json_object, json_schema, regex, choice };

struct guided_decoding {
  guided_kind kind = guided_kind::none;
  std::string source;                // json_schema: the schema's JSON text; regex: the pattern
  std::vector<std::string> choices;  // choice: the output is exactly one of these
};

// Embeddings: the prompt's final hidden states (after the last norm) pooled into one vector, by
// its last token's or by the mean over all its tokens, L2-normalized when asked.
enum class pooling_kind : uint8_t { none = 0, last, mean };

// A bias added to one token's logit before sampling (OpenAI's logit_bias): -100 bans the token,
// 100 all but forces it.
struct token_bias {
  int32_t token_id = 0;
  float bias = 0.0f;
};

struct sampling_params {
  float temperature = 1.0f;         // 0 means greedy
  int top_k = 0;                    // 0: off (a request's -1 is made 0 by normalize_sampling_params)
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // 1: off; applied to prompt and generated tokens
  float presence_penalty = 0.0f;    // applied to generated tokens
  float frequency_penalty = 0.0f;   // applied to generated tokens
  std::optional<uint64_t> seed;     // set: the request's samples are reproducible
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  // Stop strings: the text ends just before the first match, matched across token boundaries
  // by the detokenizer (the only stage that sees text); the stop string itself is never emitted.
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int logprobs = -1;  // -1: none; 0: the sampled token's; n: also the top n
  // vLLM's prompt_logprobs: for each prompt token after the first, its logprob under the model
  // given the tokens before it, its rank, and the top n alternatives. -1: none. Such a request
  // is computed from its first token (no prefix-cache hit: the skipped positions would have no
  // logits), and every prompt row's logits are computed, which costs a vocab-wide row each.
  int prompt_logprobs = -1;
  guided_decoding guided;
  // Speculative decoding: draft tokens the engine may propose and verify per step for this
  // request. -1: the engine's default (its `[speculative] num_draft_tokens`, 0 unless set);
  // 0: off; n: up to n (capped by the engine's max_speculative_tokens). Greedy outputs are the
  // same either way; sampled outputs follow the same distribution.
  int num_speculative_tokens = -1;
  // Added to the logits before penalties and sampling; token ids are checked against the
  // vocabulary by the tokenizer stage, the only one that knows it.
  std::vector<token_bias> logit_bias;
  // Whether the text leaves out special tokens (vLLM's default). A chat whose tool calls or
  // reasoning are written in special tokens (Llama's <|python_tag|>, Mistral's [TOOL_CALLS],
  // gpt-oss's channels) keeps them, so that the door can read the answer back.
  bool skip_special_tokens = true;
  // An embedding request (pooling set): the worker pools the prompt's hidden states and sends
  // the vector with the one token it samples (max_tokens 1), which nobody reads.
  pooling_kind pooling = pooling_kind::none;
  bool normalize_embedding = true;
  // The logits plugins (include/troupe/plugin.h, on_logits) the worker runs on this request's
  // row before each sample, in this order: names the server loaded (the tokenizer stage refuses
  // others by name). Wire name `plugins`. Such a request is sampled on the host.
  std::vector<std::string> logits_plugins;
};

inline bool is_guided(const sampling_params& params) { return params.guided.kind != guided_kind::none; }

// The first value of a request that breaks a rule: the field as the ZeroMQ protocol names it
// ("top_k", "stop[2]") and what is wrong with it, without the field's name (each door words
// the whole message its own way and may name the field as its API does).
struct sampling_problem {
  std::string field;
  std::string problem;
};

// Checks every value against the rules and the door's limits (max_model_len, stop strings,
// stop ids, logprobs); nothing is changed. Rules: temperature in [0, 100]; top_k -1 or 0 (off)
// or a positive count; top_p in (0, 1]; min_p in [0, 1]; repetition_penalty in (0, 100];
// presence and frequency penalties in [-2, 2]; seed in [0, 2^63 - 1] (what JSON clients and
// vLLM can send); max_tokens in [1, max_model_len]; logprobs and prompt_logprobs in [-1, max_logprobs]; stop
// strings non-empty, bounded in number and bytes; stop ids non-negative, bounded in number;
// num_speculative_tokens in [-1, max_speculative_tokens]; logit_bias bounded in number, its token
// ids non-negative, its biases in [-100, 100]; plugins bounded in number, each name non-empty,
// bounded in bytes and given once;
// a guided schema or regex non-empty and within max_string_bytes, choices non-empty and bounded
// like stop strings in number. Whether the constraint compiles is grammar/'s verdict
// (check_guided_decoding), which the doors ask next.
std::optional<sampling_problem> validate_sampling_params(const sampling_params& params, const protocol_limits& limits);

// Gives each "off" its one spelling for the engine: top_k -1 (vLLM's) becomes 0. Doors call it
// after validate_sampling_params accepted the values.
void normalize_sampling_params(sampling_params& params);

}  // namespace troupe
