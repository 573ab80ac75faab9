#pragma once
// What a request asks of the sampler and of the stopping rules.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe {

struct sampling_params {
  float temperature = 1.0f;  // 0 means greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
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
};

}  // namespace troupe
