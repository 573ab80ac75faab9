#include "engine/model_runner.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "engine/ngram_proposer.hpp"
#include "model/stage_lost_error.hpp"

namespace troupe {

namespace {

// A step that could not run because the step before it failed (its message carries that cause).
struct previous_step_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The same when that cause was a lost pipeline stage: its type goes on with it, so the requests
// of this step too are run again instead of failed (model/stage_lost_error.hpp).
struct previous_step_lost_stage : stage_lost_error {
  using stage_lost_error::stage_lost_error;
};

// The token `request_id` got in `samples`, or nullptr. `cursor` starts where the previous lookup
// ended: plans list running sequences in one order, so the search usually ends at once.
template <class Samples>
const int32_t* find_sample(const Samples& samples, int64_t request_id, size_t& cursor) {
  for (size_t n = 0; n < samples.size(); ++n, ++cursor) {
    if (cursor >= samples.size()) cursor = 0;
    if (samples[cursor].first == request_id) return &samples[cursor++].second;
  }
  return nullptr;
}

// Empties `batch` but keeps its vectors' capacity: the runner flattens a plan of about the same
// shape every step, and allocating a dozen vectors anew each time is on the critical path.
void clear_keeping_capacity(forward_batch& batch) {
  for (auto* v : {&batch.token_ids, &batch.positions, &batch.query_start, &batch.context_lengths,
                  &batch.block_table_start, &batch.block_tables, &batch.logits_rows, &batch.hidden_rows}) {
    v->clear();
  }
  batch.slot_mapping.clear();
}

// Flattens `plan` into `batch`; table_of(i) is entry i's whole block table, drafts_of(i) the
// draft tokens that follow its new tokens (speculative decoding: every one of them, and the last
// new token, gets a logits row).
template <class TableOf, class DraftsOf>
void flatten_plan(const step_plan& plan, int block_size, TableOf table_of, DraftsOf drafts_of, forward_batch& batch) {
  clear_keeping_capacity(batch);
  const size_t num_tokens = static_cast<size_t>(plan.num_tokens());
  const size_t num_seqs = plan.sequences.size();
  batch.token_ids.reserve(num_tokens);
  batch.positions.reserve(num_tokens);
  batch.slot_mapping.reserve(num_tokens);
  batch.query_start.reserve(num_seqs + 1);
  batch.context_lengths.reserve(num_seqs);
  batch.block_table_start.reserve(num_seqs + 1);
  batch.logits_rows.reserve(num_seqs);
  batch.query_start.push_back(0);
  batch.block_table_start.push_back(0);
  for (size_t entry = 0; entry < plan.sequences.size(); ++entry) {
    const scheduled_sequence& s = plan.sequences[entry];
    const std::vector<int32_t>& block_table = table_of(entry);
    const std::vector<int32_t>& drafts = drafts_of(entry);
    const int num_inputs = s.num_new_tokens() + static_cast<int>(drafts.size());
    const int context = s.num_computed_tokens + num_inputs;
    const int blocks_needed = (context + block_size - 1) / block_size;
    if (static_cast<int>(block_table.size()) < blocks_needed) {
      throw std::runtime_error("model_runner: request " + std::to_string(s.request_id) + " has " +
                               std::to_string(block_table.size()) + " KV blocks for " + std::to_string(context) +
                               " tokens, expected at least " + std::to_string(blocks_needed));
    }
    for (int i = 0; i < num_inputs; ++i) {
      const int position = s.num_computed_tokens + i;
      batch.token_ids.push_back(i < s.num_new_tokens() ? s.new_token_ids[i] : drafts[i - s.num_new_tokens()]);
      batch.positions.push_back(position);
      batch.slot_mapping.push_back(static_cast<int64_t>(block_table[position / block_size]) * block_size +
                                   position % block_size);
    }
    batch.query_start.push_back(static_cast<int32_t>(batch.token_ids.size()));
    batch.context_lengths.push_back(context);
    batch.block_tables.insert(batch.block_tables.end(), block_table.begin(), block_table.begin() + blocks_needed);
    batch.block_table_start.push_back(static_cast<int32_t>(batch.block_tables.size()));
    if (s.sample) {
      for (int row = batch.query_start.back() - 1 - static_cast<int>(drafts.size()); row < batch.query_start.back();
           ++row) {
        batch.logits_rows.push_back(row);
      }
    }
  }
}

const std::vector<int32_t> no_drafts;

}  // namespace

model_runner::model_runner(model& m, uint64_t sampler_seed, bool device_sampling)
    : model_(m),
      sampler_(sampler_seed),
      proposer_(std::make_unique<ngram_proposer>()),
      device_sampling_(device_sampling),
      device_rng_(~sampler_seed) {}

void model_runner::set_draft_proposer(std::unique_ptr<draft_proposer> proposer) {
  if (!proposer) throw std::invalid_argument("model_runner: set_draft_proposer needs a proposer");
  proposer_ = std::move(proposer);
}

bool model_runner::samples_plainly(const sampling_params& p) {
  return samples_plainly_but_for_constraint(p) && !is_guided(p);
}

bool model_runner::samples_plainly_but_for_constraint(const sampling_params& p) {
  return !uses_penalties(p) && p.logit_bias.empty() && p.min_p == 0.0f && p.logprobs < 0 && p.prompt_logprobs < 0 &&
         p.logits_plugins.empty();
}

void model_runner::build_batch(const step_plan& plan, int block_size, forward_batch& batch) {
  for (const scheduled_sequence& s : plan.sequences) {
    if (s.block_table_start != 0) {
      throw std::runtime_error("model_runner: request " + std::to_string(s.request_id) +
                               " sends its block table from block " + std::to_string(s.block_table_start) +
                               "; build_batch takes whole tables only");
    }
  }
  flatten_plan(
      plan, block_size, [&](size_t i) -> const std::vector<int32_t>& { return plan.sequences[i].block_table; },
      [](size_t) -> const std::vector<int32_t>& { return no_drafts; }, batch);
}

void model_runner::stream_kv_to(std::unique_ptr<kv_layer_sink> sink) { kv_out_ = std::move(sink); }

void model_runner::apply_entries(const step_plan& plan) {
  for (int64_t id : plan.finished_ids) {
    end_request(id);
    if (requests_.erase(id) != 0) proposer_->forget(id);
    if (kv_out_) kv_out_->forget(id, false);
  }
  for (int64_t id : plan.preempted_ids) {
    if (requests_.erase(id) != 0) proposer_->forget(id);
    if (kv_out_) kv_out_->forget(id, true);
  }
  entry_states_.clear();
  for (const scheduled_sequence& s : plan.sequences) {
    request_state* state = nullptr;
    if (s.block_table_start == 0) {
      if (!s.params) {
        throw std::runtime_error("model_runner: step " + std::to_string(plan.step_id) + " starts request " +
                                 std::to_string(s.request_id) + " on the worker without its sampling parameters");
      }
      if ((uses_penalties(*s.params) || is_guided(*s.params) || s.speculative || s.params->prompt_logprobs >= 0 ||
           !s.params->logits_plugins.empty()) &&
          static_cast<int>(s.penalty_token_ids.size()) < s.num_prompt_tokens) {
        throw std::runtime_error("model_runner: step " + std::to_string(plan.step_id) + " starts request " +
                                 std::to_string(s.request_id) + " with penalties or a constraint but a history of " +
                                 std::to_string(s.penalty_token_ids.size()) + " tokens for a prompt of " +
                                 std::to_string(s.num_prompt_tokens));
      }
      state = &requests_[s.request_id];
      state->block_table.assign(s.block_table.begin(), s.block_table.end());
      state->params = *s.params;
      state->penalty_token_ids.assign(s.penalty_token_ids.begin(), s.penalty_token_ids.end());
      state->num_prompt_tokens = s.num_prompt_tokens;
      state->speculative = s.speculative;
      state->plugins_failed = false;
      state->pooled.clear();  // a fresh start (or a recompute after preemption) pools anew
      state->num_pooled = 0;
      state->prompt_logprobs.clear();
      proposer_->forget(s.request_id);  // new to the worker, or back after preemption: start afresh
      if (kv_out_) {
        if (s.kv_send_transfer_id != 0) {
          kv_out_->start(s.request_id, s.kv_send_transfer_id);
        } else {
          kv_out_->forget(s.request_id, false);
        }
      }

      state->matcher.reset();
      if (is_guided(*s.params)) start_matcher(plan.step_id, s, *state);
    } else {
      auto it = requests_.find(s.request_id);
      const size_t held = it == requests_.end() ? 0 : it->second.block_table.size();
      if (s.block_table_start < 0 || held != static_cast<size_t>(s.block_table_start)) {
        throw std::runtime_error("model_runner: step " + std::to_string(plan.step_id) + " continues request " +
                                 std::to_string(s.request_id) + "'s block table at block " +
                                 std::to_string(s.block_table_start) + ", but the worker holds " +
                                 std::to_string(held) + " blocks for it");
      }
      state = &it->second;
      state->block_table.insert(state->block_table.end(), s.block_table.begin(), s.block_table.end());
    }
    entry_states_.push_back(state);  // unordered_map values stay where they are on insertion
  }
}

void model_runner::start_matcher(uint64_t step_id, const scheduled_sequence& s, request_state& state) {
  state.matcher = grammars_.start(state.params.guided, s.request_id, !state.params.skip_special_tokens);
  // A request resumed elsewhere (failover, disaggregation, preemption) arrives with outputs:
  // the matcher walks them first.
  for (size_t i = static_cast<size_t>(s.num_prompt_tokens); i < s.penalty_token_ids.size(); ++i) {
    if (!state.matcher->advance(s.penalty_token_ids[i])) {
      throw std::runtime_error(
          "model_runner: step " + std::to_string(step_id) + " resumes request " + std::to_string(s.request_id) +
          " whose output token " + std::to_string(s.penalty_token_ids[i]) + " (output " +
          std::to_string(i - static_cast<size_t>(s.num_prompt_tokens)) + ") its grammar does not allow");
    }
  }
  if (!state.keeps_history()) state.penalty_token_ids.clear();  // the matcher holds what counts
}

void model_runner::fill_previous_samples(const step_plan& plan, const sample_list& previous) {
  size_t cursor = 0;
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const scheduled_sequence& s = plan.sequences[i];
    if (!s.input_from_previous_sample) continue;
    const int32_t* token = find_sample(previous, s.request_id, cursor);
    if ((token == nullptr || s.new_token_ids.empty()) && !last_failure_.empty()) {
      // The common case under overlapped scheduling: this step was planned before the one
      // before it failed. Its requests fail with that step's cause, which names what broke.
      const std::string why = "step " + std::to_string(plan.step_id) +
                              " needs the samples of the step before it, which failed: " + last_failure_;
      if (last_failure_lost_stage_) throw previous_step_lost_stage(why);
      throw previous_step_failed(why);
    }
    if (token == nullptr || s.new_token_ids.empty()) {
      throw std::runtime_error("model_runner: step " + std::to_string(plan.step_id) + " asks for the token request " +
                               std::to_string(s.request_id) + " sampled in the previous step, which sampled none");
    }
    const size_t last_input = static_cast<size_t>(batch_.query_start[i + 1] - 1) - drafts_[i].size();
    batch_.token_ids[last_input] = *token;
  }
}

step_result model_runner::run(const step_plan& plan) {
  try {
    step_result result = run_step(plan);
    last_failure_.clear();
    last_failure_lost_stage_ = false;
    return result;
  } catch (const previous_step_failed&) {
    throw;  // the cause stays the first failed step's, however many follow it
  } catch (const previous_step_lost_stage&) {
    throw;
  } catch (const stage_lost_error& e) {
    last_failure_ = e.what();
    last_failure_lost_stage_ = true;
    throw;
  } catch (const std::exception& e) {
    last_failure_ = e.what();
    last_failure_lost_stage_ = false;
    throw;
  }
}

step_result model_runner::run_step(const step_plan& plan) {
  step_result result;
  result.step_id = plan.step_id;
  // Only the run right before may be referred to; after a failed run nothing may be.
  previous_samples_.swap(last_samples_);
  last_samples_.clear();
  apply_entries(plan);
  if (plan.empty()) return result;
  prepare_batch(plan, previous_samples_);
  forward(plan);
  sample(plan, result);
  if (batch_.after_layer_kv) kv_out_->finish_step();
  remember_samples(result);
  return result;
}

void model_runner::prepare_batch(const step_plan& plan, const sample_list& previous) {
  const kv_cache_shape shape = model_.kv_shape();
  propose_drafts(plan);
  flatten_plan(
      plan, shape.block_size, [&](size_t i) -> const std::vector<int32_t>& { return entry_states_[i]->block_table; },
      [&](size_t i) -> const std::vector<int32_t>& { return drafts_[i]; }, batch_);
  fill_previous_samples(plan, previous);
  collect_hidden_rows(plan);
  collect_prompt_rows(plan);
  for (int32_t block : batch_.block_tables) {
    if (block < 0 || block >= shape.num_blocks) {
      throw std::runtime_error("model_runner: block id " + std::to_string(block) + " outside the model's pool of " +
                               std::to_string(shape.num_blocks) + " blocks");
    }
  }
  batch_.after_layer_kv = nullptr;
  if (kv_out_) {
    tables_.clear();
    for (const request_state* state : entry_states_) tables_.push_back(&state->block_table);
    if (kv_out_->prepare(plan, tables_))
      batch_.after_layer_kv = [this](int layer) { kv_out_->on_layer_written(layer); };
  }
}

void model_runner::forward(const step_plan& plan) {
  // The check reads only parameters; the masks come after it, so a step that stays on the host
  // (every step on the CPU backend) never queries a matcher twice.
  last_on_device_ = can_sample_on_device(plan) && take_device_masks(plan);
  if (!last_on_device_) {
    forward_to_host();
    return;
  }
  // Where the logits stay on the device, the model draws the tokens in the same call: the rows
  // never cross to the host.
  set_device_sampling_rows(plan);
  device_tokens_.assign(rows_.size(), -1);
  model_.forward_sample(batch_, rows_, device_tokens_.data());
}

void model_runner::sample(const step_plan& plan, step_result& result) {
  if (last_on_device_) {
    take_device_samples(plan, result);
  } else {
    sample_on_host(plan, result);
  }
}

void model_runner::remember_samples(const step_result& result) {
  // The last token of each request (an entry that verified drafts yields several) is what a
  // placeholder input in the next plan stands for.
  last_samples_.reserve(result.tokens.size());
  for (const sampled_token& t : result.tokens) {
    if (!last_samples_.empty() && last_samples_.back().first == t.request_id) {
      last_samples_.back().second = t.token_id;
    } else {
      last_samples_.emplace_back(t.request_id, t.token_id);
    }
  }
}

void model_runner::record_output(int64_t request_id, request_state& state, int32_t token) {
  if (state.keeps_history()) state.penalty_token_ids.push_back(token);
  if (state.matcher && !state.matcher->advance(token)) {
    throw std::runtime_error("model_runner: request " + std::to_string(request_id) + " sampled token " +
                             std::to_string(token) + ", which its grammar does not allow");
  }
}

void model_runner::propose_drafts(const step_plan& plan) {
  drafts_.resize(plan.sequences.size());
  for (auto& d : drafts_) d.clear();
  draft_requests_.clear();
  draft_entries_.clear();
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const scheduled_sequence& s = plan.sequences[i];
    const request_state& state = *entry_states_[i];
    // A logits plugin judges one row per step, after the tokens before it are known: no drafts.
    if (!s.sample || s.num_draft_slots <= 0 || !state.speculative || !state.params.logits_plugins.empty()) continue;
    draft_requests_.push_back(draft_request{s.request_id, state.penalty_token_ids, s.num_draft_slots});
    draft_entries_.push_back(i);
  }
  if (draft_requests_.empty()) return;
  proposer_->propose(draft_requests_, proposed_);
  const int vocab = model_.config().vocab_size;
  for (size_t r = 0; r < draft_requests_.size() && r < proposed_.size(); ++r) {
    const size_t entry = draft_entries_[r];
    request_state& state = *entry_states_[entry];
    std::vector<int32_t>& drafts = drafts_[entry];
    // A draft the target could never accept only costs a slot: stop at the first such one.
    std::optional<grammar_matcher> walker;
    if (state.matcher) walker.emplace(*state.matcher);
    for (int32_t token : proposed_[r]) {
      if (static_cast<int>(drafts.size()) >= draft_requests_[r].max_drafts) break;
      if (token < 0 || token >= vocab) break;
      if (walker && !walker->advance(token)) break;
      drafts.push_back(token);
    }
  }
}

bool model_runner::can_sample_on_device(const step_plan& plan) const {
  if (!device_sampling_ || !model_.can_sample_on_device() || batch_.num_logits() == 0) return false;
  if (!batch_.hidden_rows.empty()) return false;  // pooling reads hidden states on the host
  // Prompt logprobs read whole logits rows on the host.
  if (std::any_of(prompt_entry_rows_.begin(), prompt_entry_rows_.end(), [](int n) { return n > 0; })) return false;
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    if (!plan.sequences[i].sample) continue;
    const request_state& state = *entry_states_[i];
    // A constraint is a token mask the device applies (with a matcher to give it); anything else
    // beyond temperature, top-k and top-p needs the whole row on the host.
    const bool plain = state.matcher ? samples_plainly_but_for_constraint(state.params) : samples_plainly(state.params);
    // Verifying drafts takes the host sampler (one row per draft, judged one after another).
    if (!plain || !drafts_[i].empty()) return false;
  }
  return true;
}

bool model_runner::take_device_masks(const step_plan& plan) {
  device_masks_.assign(plan.sequences.size(), std::span<const uint64_t>{});
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const scheduled_sequence& s = plan.sequences[i];
    request_state& state = *entry_states_[i];
    if (!s.sample || !state.matcher) continue;
    // The same query the host sampler would make for this row (verify_entry, j = 0).
    const std::span<const int32_t> allowed = state.matcher->allowed(state.params.max_tokens - s.output_index);
    const std::span<const uint64_t> bits = state.matcher->allowed_bits();
    // No bits (the length rule cut the state's mask) or nothing allowed: the host sampler
    // handles the row, and reports the latter naming the request.
    if (allowed.empty() || bits.empty()) return false;
    device_masks_[i] = bits;
  }
  return true;
}

void model_runner::set_device_sampling_rows(const step_plan& plan) {
  rows_.clear();
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const scheduled_sequence& s = plan.sequences[i];
    if (!s.sample) continue;
    const sampling_params& params = entry_states_[i]->params;
    device_sampling_row row;
    row.temperature = params.temperature;
    row.top_k = params.top_k;
    row.top_p = params.top_p;
    // A seeded request draws uniform(seed, output_index), the very number the host sampler draws.
    row.seed = params.seed ? *params.seed : device_rng_();
    row.offset = params.seed ? static_cast<uint64_t>(s.output_index) : 0;
    row.allowed_bits = device_masks_[i];  // structured output: the grammar's mask, applied on the device
    rows_.push_back(row);
  }
}

void model_runner::take_device_samples(const step_plan& plan, step_result& result) {
  const int vocab = model_.config().vocab_size;
  result.tokens.reserve(rows_.size());
  size_t row = 0;
  for (const scheduled_sequence& s : plan.sequences) {
    if (!s.sample) continue;
    const bool masked = !rows_[row].allowed_bits.empty();
    const int32_t token = device_tokens_[row++];
    if (masked && token < 0) {
      throw std::runtime_error("model_runner: request " + std::to_string(s.request_id) +
                               " allows no token: the device found none its grammar allows with a usable logit");
    }
    if (token < 0 || token >= vocab) {
      throw std::runtime_error("model_runner: the device sampled token " + std::to_string(token) + " for request " +
                               std::to_string(s.request_id) + ", outside the vocabulary of " + std::to_string(vocab));
    }
    sampled_token t;
    t.request_id = s.request_id;
    t.token_id = token;
    result.tokens.push_back(std::move(t));
  }
  size_t next = 0;
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    if (plan.sequences[i].sample)
      record_output(plan.sequences[i].request_id, *entry_states_[i], result.tokens[next++].token_id);
  }
}

void model_runner::forward_to_host() {
  logits_.resize(static_cast<size_t>(batch_.num_logits()) * static_cast<size_t>(model_.config().vocab_size));
  batch_.hidden_out = nullptr;
  if (!batch_.hidden_rows.empty()) {
    hidden_.resize(batch_.hidden_rows.size() * static_cast<size_t>(model_.config().hidden_size));
    batch_.hidden_out = hidden_.data();
  }
  model_.forward(batch_, logits_.data());
}

void model_runner::sample_on_host(const step_plan& plan, step_result& result) {
  int num_prompt_rows = 0;
  for (int n : prompt_entry_rows_) num_prompt_rows += n;
  result.tokens.reserve(static_cast<size_t>(batch_.num_logits() - num_prompt_rows));
  std::vector<int> token_of_entry(plan.sequences.size(), -1);
  int row = 0;
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    if (!plan.sequences[i].sample) continue;
    token_of_entry[i] = static_cast<int>(result.tokens.size());
    // A request its plugins failed still gets its token (the scheduler drops it with the request).
    if (!entry_states_[i]->params.logits_plugins.empty() && !entry_states_[i]->plugins_failed) {
      run_logits_plugins(plan, i, row, result);
    }
    row += verify_entry(plan, i, row, result);
  }
  if (!batch_.hidden_rows.empty()) pool_hidden_states(plan, token_of_entry, result);
  take_prompt_logprobs(plan, token_of_entry, row, result);
}

void model_runner::run_logits_plugins(const step_plan& plan, size_t entry, int row, step_result& result) {
  const scheduled_sequence& s = plan.sequences[entry];
  request_state& state = *entry_states_[entry];
  const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
  std::string why;
  if (!logits_hook_) {
    why = "this worker runs no logits plugins, and the request names plugin '" + state.params.logits_plugins.front() +
          "'";
  } else {
    why = logits_hook_->process(state.params.logits_plugins, s.request_id, state.penalty_token_ids,
                                state.num_prompt_tokens,
                                std::span<float>(logits_.data() + static_cast<size_t>(row) * vocab, vocab));
  }
  if (why.empty()) return;
  state.plugins_failed = true;
  result.failed.push_back(failed_request{s.request_id, std::move(why)});
}

void model_runner::end_request(int64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end() || !logits_hook_ || it->second.params.logits_plugins.empty()) return;
  logits_hook_->end(request_id, it->second.params.logits_plugins);
}

void model_runner::collect_prompt_rows(const step_plan& plan) {
  prompt_entry_rows_.assign(plan.sequences.size(), 0);
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const request_state& state = *entry_states_[i];
    const scheduled_sequence& s = plan.sequences[i];
    // A request back with outputs (preempted, resumed elsewhere) sent its prompt's with its first.
    if (state.params.prompt_logprobs < 0 || s.output_index != 0) continue;
    // Row k is position num_computed + k; its logits judge the prompt's next token, which exists
    // up to the prompt's last position but one.
    const int num_rows = std::clamp(state.num_prompt_tokens - 1 - s.num_computed_tokens, 0, s.num_new_tokens());
    for (int k = 0; k < num_rows; ++k) batch_.logits_rows.push_back(batch_.query_start[i] + k);
    prompt_entry_rows_[i] = num_rows;
  }
}

void model_runner::take_prompt_logprobs(const step_plan& plan, const std::vector<int>& token_of_entry, int first_row,
                                        step_result& result) {
  const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
  int row = first_row;
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    request_state& state = *entry_states_[i];
    const scheduled_sequence& s = plan.sequences[i];
    if (state.params.prompt_logprobs < 0 || s.output_index != 0) continue;
    for (int k = 0; k < prompt_entry_rows_[i]; ++k, ++row) {
      const size_t next = static_cast<size_t>(s.num_computed_tokens + k + 1);
      if (next >= state.penalty_token_ids.size()) {
        throw std::runtime_error("model_runner: request " + std::to_string(s.request_id) +
                                 " wants prompt logprobs at " + "position " + std::to_string(next) +
                                 " but its entry sent a prompt of " + std::to_string(state.penalty_token_ids.size()) +
                                 " tokens");
      }
      std::span<const float> logits(logits_.data() + static_cast<size_t>(row) * vocab, vocab);
      state.prompt_logprobs.push_back(
          sampler_.prompt_logprob(logits, state.penalty_token_ids[next], state.params.prompt_logprobs));
    }
    if (token_of_entry[i] >= 0) {
      result.tokens[static_cast<size_t>(token_of_entry[i])].prompt_logprobs = std::move(state.prompt_logprobs);
      state.prompt_logprobs.clear();
    }
  }
}

void model_runner::collect_hidden_rows(const step_plan& plan) {
  hidden_entry_rows_.assign(plan.sequences.size(), 0);
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const request_state& state = *entry_states_[i];
    if (state.params.pooling == pooling_kind::none) continue;
    const scheduled_sequence& s = plan.sequences[i];
    const int first_row = batch_.query_start[i];
    // The prompt's rows of this entry (a plan made before the request's end was seen may feed
    // its sampled token back: that row is no part of the prompt).
    const int num_prompt_rows = std::clamp(state.num_prompt_tokens - s.num_computed_tokens, 0, s.num_new_tokens());
    if (state.params.pooling == pooling_kind::mean) {
      for (int k = 0; k < num_prompt_rows; ++k) batch_.hidden_rows.push_back(first_row + k);
      hidden_entry_rows_[i] = num_prompt_rows;
    } else if (num_prompt_rows > 0 && s.num_computed_tokens + num_prompt_rows == state.num_prompt_tokens) {
      batch_.hidden_rows.push_back(first_row + num_prompt_rows - 1);  // last: the prompt's last token
      hidden_entry_rows_[i] = 1;
    }
  }
}

void model_runner::pool_hidden_states(const step_plan& plan, const std::vector<int>& token_of_entry,
                                      step_result& result) {
  const size_t hidden = static_cast<size_t>(model_.config().hidden_size);
  size_t next_row = 0;
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    request_state& state = *entry_states_[i];
    if (state.params.pooling == pooling_kind::none) continue;
    if (state.pooled.size() != hidden) state.pooled.assign(hidden, 0.0);
    for (int k = 0; k < hidden_entry_rows_[i]; ++k, ++next_row) {
      const float* row = hidden_.data() + next_row * hidden;
      if (state.params.pooling == pooling_kind::last) {
        std::copy(row, row + hidden, state.pooled.begin());
        state.num_pooled = 1;
      } else {
        for (size_t j = 0; j < hidden; ++j) state.pooled[j] += row[j];
        ++state.num_pooled;
      }
    }
    const scheduled_sequence& s = plan.sequences[i];
    const bool prompt_done = s.num_computed_tokens + s.num_new_tokens() >= state.num_prompt_tokens;
    if (token_of_entry[i] < 0 || !prompt_done || s.output_index != 0 || state.num_pooled == 0) continue;
    std::vector<float>& out = result.tokens[static_cast<size_t>(token_of_entry[i])].embedding;
    out.resize(hidden);
    double norm = 0.0;
    for (size_t j = 0; j < hidden; ++j) {
      const double v = state.pooled[j] / state.num_pooled;
      norm += v * v;
      out[j] = static_cast<float>(v);
    }
    if (state.params.normalize_embedding && norm > 0.0) {
      const double scale = 1.0 / std::sqrt(norm);
      for (size_t j = 0; j < hidden; ++j) out[j] = static_cast<float>(state.pooled[j] / state.num_pooled * scale);
    }
  }
}

int model_runner::verify_entry(const step_plan& plan, size_t entry, int row, step_result& result) {
  const scheduled_sequence& s = plan.sequences[entry];
  request_state& state = *entry_states_[entry];
  const std::vector<int32_t>& drafts = drafts_[entry];
  const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
  const int num_drafts = static_cast<int>(drafts.size());
  // Position j follows the last input and drafts[0, j): its token is output s.output_index + j.
  // The history and the grammar advance with each output before the next position is judged,
  // exactly as plain decoding would have had them.
  for (int j = 0; j <= num_drafts; ++j) {
    std::span<const float> logits(logits_.data() + static_cast<size_t>(row + j) * vocab, vocab);
    // The history already holds the token a placeholder input stands for: this runner sampled it.
    sample_context context{s.request_id, s.output_index + j, state.penalty_token_ids, state.num_prompt_tokens};
    if (state.matcher) {
      context.constrained = true;
      context.allowed_token_ids = state.matcher->allowed(state.params.max_tokens - context.output_index);
      context.allowed_bits = state.matcher->allowed_bits();
    }
    bool accepted = false;
    sampled_token token = j < num_drafts ? sampler_.verify(logits, state.params, context, drafts[j], accepted)
                                         : sampler_.sample(logits, state.params, context);
    if (j == 0) token.num_drafts = num_drafts;
    record_output(s.request_id, state, token.token_id);
    result.tokens.push_back(std::move(token));
    if (!accepted) break;
  }
  return num_drafts + 1;
}

}  // namespace troupe
