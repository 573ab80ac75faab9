#include "protocol/sampling_params.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

namespace troupe {

namespace {

std::string number_text(float value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", static_cast<double>(value));
  return text;
}

// Written so that NaN fails too: every comparison with NaN is false.
std::optional<sampling_problem> within(const char* field, float value, float lo, float hi, bool lo_open = false) {
  const bool above_lo = lo_open ? value > lo : value >= lo;
  if (above_lo && value <= hi) return std::nullopt;
  return sampling_problem{field, std::string("must be in ") + (lo_open ? "(" : "[") + number_text(lo) + ", " +
                                     number_text(hi) + "], got " + number_text(value)};
}

}  // namespace

std::optional<sampling_problem> validate_sampling_params(const sampling_params& p, const protocol_limits& limits) {
  if (auto problem = within("temperature", p.temperature, 0.0f, 100.0f)) return problem;
  if (p.top_k < -1) {
    return sampling_problem{"top_k", "must be -1 or 0 (off) or a positive count, got " + std::to_string(p.top_k)};
  }
  if (auto problem = within("top_p", p.top_p, 0.0f, 1.0f, /*lo_open=*/true)) return problem;
  if (auto problem = within("min_p", p.min_p, 0.0f, 1.0f)) return problem;
  if (auto problem = within("repetition_penalty", p.repetition_penalty, 0.0f, 100.0f, /*lo_open=*/true)) return problem;
  if (auto problem = within("presence_penalty", p.presence_penalty, -2.0f, 2.0f)) return problem;
  if (auto problem = within("frequency_penalty", p.frequency_penalty, -2.0f, 2.0f)) return problem;
  // A door stores a negative seed as its two's complement, which lands above 2^63 - 1 too.
  if (p.seed && *p.seed > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return sampling_problem{"seed", "must be an integer in [0, 2^63 - 1]"};
  }
  if (p.max_tokens > limits.max_model_len) {
    return sampling_problem{"max_tokens", std::to_string(p.max_tokens) + " exceeds this model's context of " +
                                              std::to_string(limits.max_model_len) +
                                              " tokens (prompt and output together)"};
  }
  if (p.max_tokens < 1) {
    return sampling_problem{"max_tokens", std::to_string(p.max_tokens) + " is out of range [1, " +
                                              std::to_string(limits.max_model_len) + "]"};
  }
  if (p.stop_token_ids.size() > limits.max_stop_token_ids) {
    return sampling_problem{"stop_token_ids", "more than " + std::to_string(limits.max_stop_token_ids) + " entries"};
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    if (p.stop_token_ids[i] < 0) {
      return sampling_problem{"stop_token_ids[" + std::to_string(i) + "]",
                              std::to_string(p.stop_token_ids[i]) + " is not a token id"};
    }
  }
  if (p.stop.size() > limits.max_stop_strings) {
    return sampling_problem{"stop", "more than " + std::to_string(limits.max_stop_strings) + " entries"};
  }
  for (size_t i = 0; i < p.stop.size(); ++i) {
    const std::string field = "stop[" + std::to_string(i) + "]";
    // An empty stop string would end every request before its first character.
    if (p.stop[i].empty()) return sampling_problem{field, "is empty"};
    if (p.stop[i].size() > limits.max_stop_string_bytes) {
      return sampling_problem{field, "longer than " + std::to_string(limits.max_stop_string_bytes) + " bytes"};
    }
  }
  if (p.logprobs < -1 || p.logprobs > limits.max_logprobs) {
    return sampling_problem{"logprobs", std::to_string(p.logprobs) + " is out of range [-1, " +
                                            std::to_string(limits.max_logprobs) + "] (-1: none)"};
  }
  if (p.prompt_logprobs < -1 || p.prompt_logprobs > limits.max_logprobs) {
    return sampling_problem{"prompt_logprobs", std::to_string(p.prompt_logprobs) + " is out of range [-1, " +
                                                   std::to_string(limits.max_logprobs) + "] (-1: none)"};
  }
  if (p.num_speculative_tokens < -1 || p.num_speculative_tokens > limits.max_speculative_tokens) {
    return sampling_problem{"num_speculative_tokens",
                            std::to_string(p.num_speculative_tokens) + " is out of range [-1, " +
                                std::to_string(limits.max_speculative_tokens) + "] (-1: the server's default, 0: off)"};
  }
  if (p.logit_bias.size() > limits.max_logit_bias) {
    return sampling_problem{"logit_bias", "more than " + std::to_string(limits.max_logit_bias) + " entries"};
  }
  for (const token_bias& b : p.logit_bias) {
    const std::string field = "logit_bias." + std::to_string(b.token_id);
    if (b.token_id < 0) return sampling_problem{"logit_bias", std::to_string(b.token_id) + " is not a token id"};
    if (auto problem = within(field.c_str(), b.bias, -100.0f, 100.0f)) return problem;
  }
  if (p.logits_plugins.size() > limits.max_logits_plugins) {
    return sampling_problem{"plugins", "more than " + std::to_string(limits.max_logits_plugins) + " entries"};
  }
  for (size_t i = 0; i < p.logits_plugins.size(); ++i) {
    const std::string field = "plugins[" + std::to_string(i) + "]";
    const std::string& name = p.logits_plugins[i];
    if (name.empty()) return sampling_problem{field, "is empty"};
    if (name.size() > limits.max_plugin_name_bytes) {
      return sampling_problem{field, "longer than " + std::to_string(limits.max_plugin_name_bytes) + " bytes"};
    }
    for (size_t j = 0; j < i; ++j) {
      if (p.logits_plugins[j] == name) return sampling_problem{field, "names '" + name + "' a second time"};
    }
  }
  const guided_decoding& g = p.guided;
  if ((g.kind == guided_kind::json_schema || g.kind == guided_kind::regex) && g.source.empty()) {
    return sampling_problem{g.kind == guided_kind::regex ? "guided_regex" : "guided_json", "is empty"};
  }
  if (g.source.size() > limits.max_string_bytes) {
    return sampling_problem{g.kind == guided_kind::regex ? "guided_regex" : "guided_json",
                            "longer than " + std::to_string(limits.max_string_bytes) + " bytes"};
  }
  if (g.kind == guided_kind::choice) {
    if (g.choices.empty()) return sampling_problem{"guided_choice", "is empty"};
    if (g.choices.size() > limits.max_guided_choices) {
      return sampling_problem{"guided_choice", "more than " + std::to_string(limits.max_guided_choices) + " entries"};
    }
    for (size_t i = 0; i < g.choices.size(); ++i) {
      if (g.choices[i].empty()) return sampling_problem{"guided_choice[" + std::to_string(i) + "]", "is empty"};
    }
  }
  return std::nullopt;
}

void normalize_sampling_params(sampling_params& p) {
  if (p.top_k < 0) p.top_k = 0;
}

}  // namespace troupe
