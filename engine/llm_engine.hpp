#pragma once
// The whole engine in one synchronous object: requests in, one step at a time, outputs out.
// A step reads like a sentence: schedule -> run -> update.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "engine/engine_config.hpp"
#include "engine/model_runner.hpp"
#include "engine/request_error.hpp"
#include "engine/scheduler.hpp"
#include "engine/token_delta.hpp"
#include "model/model.hpp"

namespace troupe {

// New tokens, their logprobs, the finish reason and (when finished) TTFT/TPOT/E2E.
using request_output = token_delta;

// Either the new request's id or why it was refused.
struct add_request_result {
  int64_t request_id = -1;
  std::optional<request_error> error;

  bool ok() const { return !error.has_value(); }
};

class llm_engine {
 public:
  // Blocks: config.num_kv_blocks, or the model's whole pool when 0; block sizes must agree.
  // `eos_token_ids` default to the model config's.
  llm_engine(std::unique_ptr<model> m, engine_config config,
             std::optional<std::vector<int32_t>> eos_token_ids = std::nullopt,
             uint64_t sampler_seed = std::random_device{}());

  // `resumed_output_ids`: the outputs a request already generated elsewhere, to continue from
  // (scheduler::add_request); outputs then carry only the tokens generated here.
  add_request_result add_request(std::vector<int32_t> prompt_ids, sampling_params params, int priority = 0,
                                 std::span<const int32_t> resumed_output_ids = {});
  // Structured output needs the tokenizer's vocabulary as bytes (engine/guided_vocabulary.hpp);
  // without it a constrained request is refused.
  void set_vocabulary(std::shared_ptr<const token_vocabulary> vocabulary) {
    runner_.set_vocabulary(std::move(vocabulary));
  }
  // Speculative decoding's drafts (n-gram prompt lookup unless set; engine/draft_proposer.hpp).
  void set_draft_proposer(std::unique_ptr<draft_proposer> proposer) { runner_.set_draft_proposer(std::move(proposer)); }
  // False for an unknown (or already finished) id; the abort's output comes with the next step.
  bool abort(int64_t request_id);
  // Ends a request whose text matched one of its stop strings (the caller turns ids into text,
  // see stop_string_matcher) and frees its blocks. False for an unknown or finished id; the
  // final output (finish stop, no new tokens) comes with the next step.
  bool stop(int64_t request_id);
  std::vector<request_output> step();
  bool has_unfinished() const { return scheduler_.has_unfinished() || !pending_.empty(); }

  const model& get_model() const { return *model_; }
  const scheduler& get_scheduler() const { return scheduler_; }
  const engine_config& config() const { return scheduler_.config(); }

 private:
  static engine_config fit_to_model(engine_config config, const model& m);

  std::unique_ptr<model> model_;
  scheduler scheduler_;
  model_runner runner_;
  int64_t next_request_id_ = 0;
  std::vector<request_output> pending_;  // abort and stop outputs not yet returned
};

}  // namespace troupe
