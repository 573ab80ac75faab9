#pragma once
// Bounds on everything a client can make the server allocate or loop over. A frame that breaks
// one is answered with an error naming the bound; nothing from the network is trusted unbounded.

#include <cstddef>

namespace troupe {

// The longest context (prompt and output tokens of one sequence) Troupe serves: the one bound the
// configuration (`max_model_len`, `--max-model-len`), the served model's context and the
// sampling checks all use. A model trained longer is served at this length; asking for more is
// refused where the setting is read (issue 25: 2^20..2^30 passed the configuration and every
// request was then refused by the engine's check).
inline constexpr int max_served_model_len = 1 << 20;

struct protocol_limits {
  size_t max_frame_bytes = 4u << 20;   // one msgpack request
  size_t max_frames_per_message = 3;   // routing id [+ empty delimiter] + payload
  size_t max_id_bytes = 256;           // request ids
  size_t max_string_bytes = 1u << 20;  // prompt text, message content
  size_t max_prompt_token_ids = 1u << 17;
  size_t max_messages = 1024;  // chat turns
  size_t max_stop_token_ids = 64;
  size_t max_stop_strings = 16;
  size_t max_stop_string_bytes = 256;
  size_t max_map_entries = 64;  // fields of any one map
  size_t max_depth = 6;         // request -> messages -> message -> content
  // The served model's context (prompt and output; the node sets it): max_tokens beyond it
  // could never be honoured, so it is refused rather than quietly cut.
  int max_model_len = max_served_model_len;
  int max_logprobs = 20;
  size_t max_guided_choices = 256;     // guided_choice entries
  int max_speculative_tokens = 16;     // num_speculative_tokens (drafts verified per step)
  size_t max_logit_bias = 1024;        // logit_bias entries
  size_t max_logits_plugins = 8;       // plugins (logits plugins a request names)
  size_t max_plugin_name_bytes = 128;  // each of their names
};

}  // namespace troupe
