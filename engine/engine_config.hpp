#pragma once
// Limits of one engine: the KV pool's shape and the scheduler's budgets.

#include <stdexcept>
#include <string>

#include "engine/scheduling_policy_kind.hpp"

namespace troupe {

struct engine_config {
  int block_size = 16;                // tokens per KV block
  int num_kv_blocks = 0;              // 0: take the model's KV pool size
  int max_num_batched_tokens = 2048;  // token budget of one step (prefill chunks + decodes)
  int max_num_seqs = 256;             // sequences running at once
  int max_waiting_requests = 1024;    // beyond this, add_request answers `overloaded`
  int max_model_len = 2048;           // prompt + generated tokens of one sequence
  bool enable_prefix_caching = true;
  // The scheduler stage keeps two steps in flight: it plans step N+1 while the worker runs step N
  // (docs/design/engine.md, "Overlapped scheduling"). The synchronous llm_engine ignores it.
  bool async_scheduling = false;
  // Token ids a step result may carry are below this; 0: unknown, not checked.
  int vocab_size = 0;
  // The model's hidden size: the length of the embeddings its pooling requests get; 0: unknown.
  int hidden_size = 0;
  // Speculative decoding (docs/design/engine.md, "Speculative decoding"): draft slots per step
  // for a request that does not choose (sampling_params::num_speculative_tokens -1; 0: off),
  // and the most any request may have. The worker proposes the drafts (n-gram prompt lookup,
  // or its draft model) and verifies them in the step's one forward.
  int num_speculative_tokens = 0;
  int max_speculative_tokens = 16;
  // How far back any query attends: > 0 when every layer of the model slides a window this wide
  // (Mistral v0.1), and a sequence's blocks that leave it go back to the pool as it grows, so its
  // KV is bounded by the window (docs/design/models.md, "Sliding windows"); 0 keeps every block.
  // -1: the model's (llm_engine::fit_to_model and served_model fill it in; a scheduler given -1
  // keeps every block).
  int kv_window = -1;
  // How the queues are ordered (engine/scheduling_policy.hpp). With slo, slo_admission reject
  // refuses at once (overloaded) a request whose TTFT target cannot be met given the queue ahead
  // of it; best_effort serves it anyway.
  scheduling_policy_kind scheduling_policy = scheduling_policy_kind::priority;
  slo_admission_mode slo_admission = slo_admission_mode::best_effort;

  // Throws std::runtime_error naming the first bad field.
  void validate() const {
    auto positive = [](const char* name, int value) {
      if (value <= 0) {
        throw std::runtime_error(std::string("engine_config: ") + name + " must be positive, got " +
                                 std::to_string(value));
      }
    };
    positive("block_size", block_size);
    positive("num_kv_blocks", num_kv_blocks);
    positive("max_num_batched_tokens", max_num_batched_tokens);
    positive("max_num_seqs", max_num_seqs);
    positive("max_waiting_requests", max_waiting_requests);
    positive("max_model_len", max_model_len);
    if (kv_window < -1) {
      throw std::runtime_error(
          "engine_config: kv_window must be -1 (the model's), 0 (keep every block) or positive, got " +
          std::to_string(kv_window));
    }
    if (max_speculative_tokens < 0 || num_speculative_tokens < 0 || num_speculative_tokens > max_speculative_tokens) {
      throw std::runtime_error("engine_config: num_speculative_tokens " + std::to_string(num_speculative_tokens) +
                               " must be in [0, max_speculative_tokens " + std::to_string(max_speculative_tokens) +
                               "]");
    }
  }
};

}  // namespace troupe
