#pragma once
// What the model runner calls on a request's row of logits before sampling it, for a request
// that names logits plugins (sampling_params::logits_plugins): all the engine knows of plugins.
// The serving implementation (stages/plugin_logits_hook.hpp) runs the named plugins' on_logits
// (include/troupe/plugin.h) through plugins/plugin_chain; the engine itself loads no library.
//
// Contract, as the model_runner keeps it:
// - Thread: every call comes from the thread that runs the runner's steps, one at a time.
// - Rows: only host rows (a step with such a request is sampled on the host, never on a device),
//   one call per sampled row of such a request, before penalties, biases, masks and sampling;
//   such a request proposes no drafts, so there is one row per step.
// - token_ids: the prompt (its first num_prompt_tokens) and every output so far.
// - A non-empty answer fails only that request, with the answer as its message.
// - end: once when a request that named plugins leaves the worker finished (not preempted).

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace troupe {

class logits_hook {
 public:
  virtual ~logits_hook() = default;
  // Runs the `names` plugins on `logits` in place; "" when it went well, else why the request fails.
  virtual std::string process(const std::vector<std::string>& names, int64_t request_id,
                              std::span<const int32_t> token_ids, int32_t num_prompt_tokens,
                              std::span<float> logits) = 0;
  virtual void end(int64_t request_id, const std::vector<std::string>& names) = 0;
};

}  // namespace troupe
