#pragma once
// Runs a step plan on a model: flattens it into one varlen forward_batch (no padding), runs the
// forward pass, samples every row that wants a token, and returns the step_result.
// For overlapped scheduling it remembers the tokens it sampled in its last run: an entry marked
// input_from_previous_sample gets its last input token from there, so the scheduler can plan a
// step before it has seen the previous step's result.
// It also keeps each request's KV block table, sampling parameters and penalty history: a plan
// sends only the blocks appended since the previous one (scheduled_sequence::block_table_start),
// the parameters and the history once (with the entry that starts the table; the runner appends
// its own samples to the history), and the ids of requests that ended.
// On a backend that can sample where its logits are (CUDA), a step whose sampled rows are all
// plain (greedy / temperature with top-k and top-p; no penalties, min_p, logprobs or drafts) is
// sampled there, and only one token id per row crosses to the host. A constrained request keeps
// a grammar_matcher here, advanced with each token sampled for it; its step's token mask goes to
// the device with the row when the matcher has it as bits (the common case), and otherwise the
// step falls back to the host sampler, which applies the mask itself.

#include <memory>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/draft_proposer.hpp"
#include "engine/kv_layer_sink.hpp"
#include "engine/logits_hook.hpp"
#include "engine/request_grammars.hpp"
#include "engine/sampler.hpp"
#include "engine/step_plan.hpp"
#include "model/forward_batch.hpp"
#include "model/model.hpp"

namespace troupe {

class model_runner {
 public:
  // `m` must outlive the runner.
  // device_sampling: let a backend that can sample on its device do so for plain steps
  // (structured output included, with the grammar's token mask).
  explicit model_runner(model& m, uint64_t sampler_seed = std::random_device{}(), bool device_sampling = true);

  // Runs one step. A step that throws leaves the runner usable; the step after it may not ask
  // for its samples, and one that does fails with the failed step's cause (overlapped
  // scheduling plans the next step before the failure is known), as a stage_lost_error when the
  // failed step's was one.
  step_result run(const step_plan& plan);

  // Prefill-only requests (scheduled_sequence::kv_send_transfer_id) stream their KV out into
  // `sink` layer by layer as the steps compute them (engine/kv_layer_sink.hpp; serving's is
  // kvtransfer/kv_layer_streamer.hpp, built by the worker). Without one, such a request is
  // computed but its KV stays here. The runner owns the sink.
  void stream_kv_to(std::unique_ptr<kv_layer_sink> sink);

  // Speculative decoding: where drafts for entries with draft slots come from (n-gram prompt
  // lookup unless set; engine/draft_proposer.hpp). The runner owns it.
  void set_draft_proposer(std::unique_ptr<draft_proposer> proposer);
  const draft_proposer& proposer() const { return *proposer_; }

  // Logits plugins: the hook that runs the plugins a request names on its rows before they are
  // sampled (engine/logits_hook.hpp; serving's is stages/plugin_logits_hook.hpp). Without one, a
  // request naming plugins fails. The runner owns the hook.
  void set_logits_hook(std::unique_ptr<logits_hook> hook) { logits_hook_ = std::move(hook); }

  // The tokenizer's vocabulary as bytes, which structured output needs (served_model has it).
  void set_vocabulary(std::shared_ptr<const token_vocabulary> vocabulary,
                      std::shared_ptr<const token_vocabulary> with_special = nullptr) {
    grammars_.set_vocabulary(std::move(vocabulary), std::move(with_special));
  }
  bool has_vocabulary() const { return grammars_.has_vocabulary(); }

  // The batch the last run() sent to the model (for tests and tracing).
  const forward_batch& last_batch() const { return batch_; }
  // Whether the last run() sampled on the model's device (for tests and tracing).
  bool last_run_sampled_on_device() const { return last_on_device_; }

  // True when `params` need nothing but the logits row, temperature, top-k and top-p (a logits
  // plugin needs the row on the host).
  static bool samples_plainly(const sampling_params& params);
  // The same, but a structured-output constraint allowed: the device applies its token mask.
  static bool samples_plainly_but_for_constraint(const sampling_params& params);

  // Flattens `plan`, whose entries carry whole block tables (block_table_start 0), into `batch`
  // for KV blocks of `block_size` tokens. Throws when a sequence's block table does not cover
  // its tokens.
  static void build_batch(const step_plan& plan, int block_size, forward_batch& batch);

  // The requests whose block table and parameters the runner keeps (for tests).
  size_t num_requests_held() const { return requests_.size(); }
  // The penalty history the runner keeps for a request (prompt, then outputs), or nullptr when
  // it holds none (for tests).
  const std::vector<int32_t>* penalty_history(int64_t request_id) const {
    auto it = requests_.find(request_id);
    return it == requests_.end() || !uses_penalties(it->second.params) ? nullptr : &it->second.penalty_token_ids;
  }

 private:
  // (request id, token) for each row a run sampled, in its plan's order. A flat list, not a map:
  // it is rebuilt every step, and the next plan asks for the requests in nearly the same order.
  using sample_list = std::vector<std::pair<int64_t, int32_t>>;

  // What the runner keeps of a request between plans.
  struct request_state {
    std::vector<int32_t> block_table;  // the whole table
    sampling_params params;
    // With penalties, or when the request may speculate (its proposer reads it): the prompt and
    // every token sampled since (this runner's own samples are appended as they are sampled),
    // of which the first num_prompt_tokens are the prompt.
    std::vector<int32_t> penalty_token_ids;
    int32_t num_prompt_tokens = 0;
    std::unique_ptr<grammar_matcher> matcher;  // structured output only
    bool speculative = false;                  // scheduled_sequence::speculative
    // Its logits plugins failed it: the scheduler ends it, and a step planned before it knew
    // (overlapped scheduling) samples it without calling them again.
    bool plugins_failed = false;
    // Pooling (embeddings): the sum of the prompt rows' hidden states so far (mean), or the last
    // row's (last), and how many rows it holds.
    std::vector<double> pooled;  // [hidden_size]
    int32_t num_pooled = 0;
    // prompt_logprobs: the prompt positions' so far, sent with the token sampled after the prompt.
    std::vector<prompt_token_logprob> prompt_logprobs;  // [positions computed so far]
    // The history holds the prompt, whose next token each prompt row is judged against.
    // So does a request with logits plugins, whose hook reads prompt and outputs.
    bool keeps_history() const {
      return speculative || uses_penalties(params) || params.prompt_logprobs >= 0 || !params.logits_plugins.empty();
    }
  };

  // Drops the state of requests that ended or were preempted, applies each entry's blocks (and
  // parameters and penalty history, on the entry that starts a request) and points entry_states_
  // at each entry's request.
  void apply_entries(const step_plan& plan);
  // Starts a constrained request's matcher and replays the outputs its entry carries.
  void start_matcher(uint64_t step_id, const scheduled_sequence& s, request_state& state);
  // Writes the previous run's samples into the batch where the plan asks for them.
  void fill_previous_samples(const step_plan& plan, const sample_list& previous);
  // Asks the proposer for drafts for every entry with draft slots (drafts_[entry]), keeping
  // only ids in the vocabulary and, for a constrained request, the ones its grammar allows.
  void propose_drafts(const step_plan& plan);
  // A token the request now has as output: into its history, past its grammar.
  void record_output(int64_t request_id, request_state& state, int32_t token);
  // Whether every sampled row's parameters let the device sample it (reads nothing else).
  bool can_sample_on_device(const step_plan& plan) const;
  // Queries each constrained row's matcher for this step's mask into device_masks_; false when
  // one has no bit mask (or allows nothing), which keeps the step on the host.
  bool take_device_masks(const step_plan& plan);
  // The device sampler's row per sampled entry (rows_): parameters, seed and offset, mask.
  void set_device_sampling_rows(const step_plan& plan);
  // The tokens forward_sample drew (device_tokens_) into result, checked, and into the matchers.
  void take_device_samples(const step_plan& plan, step_result& result);
  // Runs the forward with the logits (and pooled hidden rows) landing in host memory.
  void forward_to_host();
  // Asks for the hidden rows pooling requests need (batch_.hidden_rows, hidden_entry_rows_).
  void collect_hidden_rows(const step_plan& plan);
  // Asks for a logits row at each prompt position whose next token is a prompt token, for
  // requests that want prompt_logprobs (after the sampled rows: prompt_entry_rows_).
  void collect_prompt_rows(const step_plan& plan);
  // Turns those rows into the requests' prompt logprobs and, on the token sampled after a
  // prompt (token_of_entry[i], or -1), attaches them all. `first_row`: the first prompt row's
  // index among the logits.
  void take_prompt_logprobs(const step_plan& plan, const std::vector<int>& token_of_entry, int first_row,
                            step_result& result);
  // Folds the rows' hidden states into their requests' pools and, on the token sampled after a
  // prompt (token_of_entry[i], or -1), attaches the finished embedding.
  void pool_hidden_states(const step_plan& plan, const std::vector<int>& token_of_entry, step_result& result);
  // Samples every sampled entry from the host logits forward_to_host left (logits plugins,
  // drafts verified, pooling and prompt logprobs taken on the way).
  void sample_on_host(const step_plan& plan, step_result& result);
  // run() without its bookkeeping of failures: prepare_batch, forward, sample, remember_samples.
  step_result run_step(const step_plan& plan);
  // The plan as one flattened forward_batch: drafts proposed, the previous run's samples filled
  // in, the rows pooling and prompt logprobs need, block ids checked, the KV sink told.
  void prepare_batch(const step_plan& plan, const sample_list& previous);
  // Runs the model over the batch: the logits land in host memory (logits_), or, where every
  // sampled row can be drawn on the device, stay there and the tokens come back (device_tokens_).
  void forward(const step_plan& plan);
  // The step's tokens into result, from where forward left the logits.
  void sample(const step_plan& plan, step_result& result);
  // What this run sampled, for the next plan's placeholder inputs.
  void remember_samples(const step_result& result);
  // Runs entry `entry`'s logits plugins on its row `row`; when they fail it, the request goes
  // into result.failed (its token is still sampled: the scheduler drops it with the request).
  void run_logits_plugins(const step_plan& plan, size_t entry, int row, step_result& result);
  // The request left the worker for good: its logits plugins drop what they kept for it.
  void end_request(int64_t request_id);
  // Verifies entry `entry`'s drafts against its logits rows, starting at `row`: the accepted
  // drafts, then the target's own token, into result. Returns the rows it used.
  int verify_entry(const step_plan& plan, size_t entry, int row, step_result& result);

  model& model_;
  sampler sampler_;
  std::unique_ptr<draft_proposer> proposer_;
  std::vector<draft_request> draft_requests_;   // this run's, for the proposer
  std::vector<size_t> draft_entries_;           // [draft_requests_] their plan entries
  std::vector<std::vector<int32_t>> proposed_;  // [draft_requests_] what the proposer said
  std::vector<std::vector<int32_t>> drafts_;    // [plan entries] the drafts verified this run
  std::unique_ptr<kv_layer_sink> kv_out_;
  std::unique_ptr<logits_hook> logits_hook_;

  std::vector<float> hidden_;           // [hidden rows, hidden_size] this run's pooled rows
  std::vector<int> hidden_entry_rows_;  // [plan entries] how many of them each entry has
  std::vector<int> prompt_entry_rows_;  // [plan entries] prompt logprob rows of each entry
  request_grammars grammars_;
  std::unordered_map<int64_t, request_state> requests_;  // by request id
  std::vector<request_state*> entry_states_;             // [plan entries] of this run
  std::vector<const std::vector<int32_t>*> tables_;      // [plan entries] their block tables
  sample_list last_samples_;                             // what the last run sampled
  sample_list previous_samples_;                         // the run before's, kept for its capacity
  std::string last_failure_;                             // why the last run threw; empty when it did not
  bool last_failure_lost_stage_ = false;                 // it threw a stage_lost_error
  forward_batch batch_;
  std::vector<float> logits_;  // [num_logits, vocab_size]
  bool device_sampling_;
  bool last_on_device_ = false;
  std::mt19937_64 device_rng_;                           // seeds for unseeded rows sampled on the device
  std::vector<device_sampling_row> rows_;                // [num_logits]
  std::vector<int32_t> device_tokens_;                   // [num_logits]
  std::vector<std::span<const uint64_t>> device_masks_;  // [plan entries] allowed_bits, or empty
};

}  // namespace troupe
