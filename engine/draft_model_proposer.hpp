#pragma once
// Drafts from a second, smaller model of the same vocabulary: it continues each request's history
// greedily for max_drafts tokens, and the target model verifies them (engine/draft_proposer.hpp).
//
// The draft has its own paged KV pool (its `model` owns it); every block of it is this proposer's.
// Per request it keeps the tokens whose K/V sit in that pool and their blocks. On each propose it
// rolls a request back to the common prefix of what it fed and the new history (the KV of
// rejected drafts is simply overwritten), catches up on the tokens it has not seen, then runs
// one token at a time. All requests of a step share each forward: forward j holds every request
// still drafting at position j (the catch-up rides in forward 0), as one varlen batch.
//
// A request the pool cannot hold this step, or whose drafts would run past the draft's context,
// gets no drafts: a proposer only costs speed, never correctness, so it never fails a step.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/draft_proposer.hpp"
#include "engine/served_model.hpp"
#include "model/forward_batch.hpp"
#include "model/model.hpp"

namespace troupe {

class draft_model_proposer final : public draft_proposer {
 public:
  // `draft` must outlive the proposer, and its whole KV pool is the proposer's. max_model_len:
  // the longest context the draft is run at (0: its max_position_embeddings). Throws
  // std::runtime_error naming both sizes when the draft's vocab_size is not target_vocab_size.
  draft_model_proposer(model& draft, int target_vocab_size, int max_model_len = 0);
  // Owns the loaded draft too (load_served_model); errors also name its path.
  draft_model_proposer(std::shared_ptr<served_model> draft, int target_vocab_size);

  void propose(std::span<const draft_request> requests, std::vector<std::vector<int32_t>>& drafts) override;
  void forget(int64_t request_id) override;
  const char* name() const override { return "draft_model"; }

  // The draft's KV pool in blocks, and those no request holds (for tests and logs).
  int num_blocks() const { return num_blocks_; }
  int num_free_blocks() const { return static_cast<int>(free_blocks_.size()); }
  size_t num_requests_held() const { return requests_.size(); }
  // One line for the log: the draft, its vocabulary and pool.
  std::string describe() const;

 private:
  struct request_state {
    std::vector<int32_t> fed;          // tokens whose K/V are in the draft's pool, in order
    std::vector<int32_t> block_table;  // holds at least ceil(fed.size() / block_size) blocks
    uint64_t last_call = 0;            // the propose call that last scheduled it
  };
  // A request drafting in this call.
  struct active_request {
    size_t index = 0;  // into the call's requests and drafts
    request_state* state = nullptr;
    int32_t first_new = 0;   // the first history position not yet in the pool
    int32_t num_drafts = 0;  // drafts it gets (forwards it takes part in)
  };

  // Rolls `r`'s state back to what still matches its history and gives it the blocks for
  // `num_drafts` drafts; false (nothing changed but the rollback) when the pool is short.
  bool prepare(const draft_request& r, int num_drafts, request_state& state, int32_t& first_new);
  // Lays out forward `position` (0: the catch-up) of every active request still drafting.
  void build_batch(std::span<const draft_request> requests, const std::vector<std::vector<int32_t>>& drafts,
                   int position);
  // Runs batch_ and leaves the argmax of each logits row in tokens_.
  void run_greedy();

  std::shared_ptr<served_model> owned_;  // set when built from a served model
  model& draft_;
  std::string source_;  // the draft's path, for logs
  int vocab_size_;
  int block_size_;
  int num_blocks_;
  int max_model_len_;

  std::vector<int32_t> free_blocks_;  // [free] the draft pool's unheld block ids
  std::unordered_map<int64_t, request_state> requests_;
  uint64_t num_calls_ = 0;

  // Per call, kept for their capacity: propose allocates nothing once they have grown.
  std::vector<active_request> active_;  // [requests drafting]
  forward_batch batch_;
  std::vector<float> logits_;              // [num_logits, vocab_size]
  std::vector<device_sampling_row> rows_;  // [num_logits] greedy rows for on-device argmax
  std::vector<int32_t> tokens_;            // [num_logits]
};

// Loads the draft model `spec` names for a target of `target_vocab_size` tokens: no tokenizer
// (only ids cross; a config.json path auto-detects as random weights of its shape), and a KV pool of exactly
// spec.num_kv_blocks, or what spec.kv_memory_mb holds at f32, on either device (on CUDA a pool sized from free memory
// would take what the target left for everything else). Throws std::runtime_error naming the path and both vocabularies
// when they differ, before the weights reach the device.
std::shared_ptr<served_model> load_draft_model(const model_spec& spec, int target_vocab_size);

}  // namespace troupe
