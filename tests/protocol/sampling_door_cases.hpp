#pragma once
// Edge cases of the sampling fields as a client writes them (JSON values; the ZeroMQ tests pack
// the same values as msgpack), with the verdict both doors must give. Used by the codec's test
// and by the test that runs both doors' parsers side by side.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::testing {

inline constexpr int door_case_max_model_len = 512;

struct sampling_door_case {
  nlohmann::json fields;      // merged into an otherwise valid request
  const char* refused_field;  // nullptr: accepted
  // A wrong type is the wire format's business: each door names types as its format does, so
  // only the verdict and the field are the same, not the words.
  bool wrong_type = false;
};

inline std::vector<sampling_door_case> sampling_door_cases() {
  using json = nlohmann::json;
  const uint64_t int64_max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  return {
      {{{"seed", -1}}, "seed"},
      {{{"seed", std::numeric_limits<int64_t>::min()}}, "seed"},
      {{{"seed", 0}}, nullptr},
      {{{"seed", int64_max}}, nullptr},
      {{{"seed", int64_max + 1}}, "seed"},
      {{{"seed", "7"}}, "seed", true},
      {{{"top_k", -1}}, nullptr},
      {{{"top_k", 0}}, nullptr},
      {{{"top_k", 100000}}, nullptr},
      {{{"top_k", -2}}, "top_k"},
      {{{"top_k", 1.5}}, "top_k", true},
      {{{"temperature", 0}}, nullptr},
      {{{"temperature", 100}}, nullptr},
      {{{"temperature", -0.5}}, "temperature"},
      {{{"temperature", 100.5}}, "temperature"},
      {{{"temperature", 1e300}}, "temperature"},
      {{{"top_p", 0}}, "top_p"},
      {{{"top_p", 1}}, nullptr},
      {{{"top_p", 1.5}}, "top_p"},
      {{{"min_p", 0}}, nullptr},
      {{{"min_p", -0.1}}, "min_p"},
      {{{"min_p", 2}}, "min_p"},
      {{{"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"repetition_penalty", 100}}, nullptr},
      {{{"presence_penalty", -2}}, nullptr},
      {{{"presence_penalty", 3}}, "presence_penalty"},
      {{{"frequency_penalty", -2.5}}, "frequency_penalty"},
      {{{"max_tokens", 1}}, nullptr},
      {{{"max_tokens", door_case_max_model_len}}, nullptr},
      {{{"max_tokens", door_case_max_model_len + 1}}, "max_tokens"},
      {{{"max_tokens", 0}}, "max_tokens"},
      {{{"max_tokens", -3}}, "max_tokens"},
      {{{"max_tokens", int64_t{1} << 40}}, "max_tokens"},
      {{{"logprobs", -1}}, nullptr},
      {{{"logprobs", 0}}, nullptr},
      {{{"logprobs", 20}}, nullptr},
      {{{"logprobs", 21}}, "logprobs"},
      {{{"logprobs", -2}}, "logprobs"},
      {{{"prompt_logprobs", 0}}, nullptr},
      {{{"prompt_logprobs", 20}}, nullptr},
      {{{"prompt_logprobs", 21}}, "prompt_logprobs"},
      {{{"prompt_logprobs", -1}}, "prompt_logprobs"},
      {{{"stop", "END"}}, nullptr},
      {{{"stop", ""}}, "stop[0]"},
      {{{"stop", json::array({"a", ""})}}, "stop[1]"},
      {{{"stop", json(std::vector<std::string>(16, "s"))}}, nullptr},
      {{{"stop", json(std::vector<std::string>(17, "s"))}}, "stop"},
      {{{"stop", std::string(256, 'a')}}, nullptr},
      {{{"stop", std::string(257, 'a')}}, "stop[0]"},
      {{{"stop", 5}}, "stop", true},
      {{{"stop_token_ids", json(std::vector<int>(64, 2))}}, nullptr},
      {{{"stop_token_ids", json(std::vector<int>(65, 2))}}, "stop_token_ids"},
      {{{"stop_token_ids", json::array({2, -1})}}, "stop_token_ids[1]"},
      {{{"num_speculative_tokens", -1}}, nullptr},
      {{{"num_speculative_tokens", 0}}, nullptr},
      {{{"num_speculative_tokens", 16}}, nullptr},
      {{{"num_speculative_tokens", 17}}, "num_speculative_tokens"},
      {{{"num_speculative_tokens", -2}}, "num_speculative_tokens"},
      {{{"num_speculative_tokens", int64_t{1} << 40}}, "num_speculative_tokens"},
      {{{"num_speculative_tokens", 2.5}}, "num_speculative_tokens", true},
      {{{"num_speculative_tokens", "4"}}, "num_speculative_tokens", true},
      {{{"num_speculative_tokens", true}}, "num_speculative_tokens", true},
      {{{"temperature", 0}, {"top_k", -1}, {"seed", 3}, {"max_tokens", 40}}, nullptr},
  };
}

}  // namespace troupe::testing
