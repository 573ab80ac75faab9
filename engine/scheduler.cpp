#include "engine/scheduler.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "engine/sampler.hpp"

namespace troupe {

namespace {
const engine_config& validated(const engine_config& config) {
  config.validate();
  return config;
}
}  // namespace

scheduler::scheduler(const engine_config& config, std::vector<int32_t> eos_token_ids)
    : config_(validated(config)),
      eos_token_ids_(std::move(eos_token_ids)),
      kv_(config.num_kv_blocks, config.block_size, config.enable_prefix_caching),
      policy_(make_scheduling_policy(config_, *step_times_)) {}

std::optional<request_error> scheduler::check_request(int64_t request_id, int num_prompt_tokens,
                                                      const sampling_params& params,
                                                      std::span<const int32_t> resumed_output_ids) const {
  auto invalid = [&](std::string why) {
    return request_error{error_code::bad_request, "request " + std::to_string(request_id) + ": " + std::move(why)};
  };
  if (sequences_.count(request_id) != 0) {
    return request_error{error_code::duplicate_id, "request " + std::to_string(request_id) + " is already live"};
  }
  if (num_prompt_tokens == 0) return invalid("the prompt is empty");
  const int num_resumed = static_cast<int>(resumed_output_ids.size());
  if (num_prompt_tokens + int64_t{num_resumed} >= config_.max_model_len) {
    const std::string resumed =
        num_resumed == 0 ? std::string() : " and " + std::to_string(num_resumed) + " resumed output tokens";
    return invalid("the prompt has " + std::to_string(num_prompt_tokens) + " tokens" + resumed +
                   ", leaving no room to generate within max_model_len " + std::to_string(config_.max_model_len));
  }
  if (auto why = check_sampling_params(params)) return invalid(std::move(*why));
  if (auto why = check_resumed_outputs(resumed_output_ids, params)) return invalid(std::move(*why));
  // A sequence must fit the pool alone, or it could be preempted forever. Behind a sliding
  // window it holds at most the window and a step's tokens (and one block each side of them).
  const int64_t most_tokens =
      std::min<int64_t>(static_cast<int64_t>(num_prompt_tokens) + params.max_tokens, config_.max_model_len);
  int blocks = kv_.blocks_for(static_cast<int>(most_tokens));
  if (config_.kv_window > 0) {
    blocks = std::min(blocks, kv_.blocks_for(config_.kv_window + config_.max_num_batched_tokens) + 1);
  }
  if (blocks > kv_.num_blocks()) {
    return invalid("prompt + max_tokens need up to " + std::to_string(blocks) + " KV blocks, the pool has " +
                   std::to_string(kv_.num_blocks()));
  }
  if (num_waiting() >= config_.max_waiting_requests) {
    return request_error{error_code::overloaded, "request " + std::to_string(request_id) +
                                                     ": the waiting queue is full (" +
                                                     std::to_string(config_.max_waiting_requests) + " requests)"};
  }
  return std::nullopt;
}

std::optional<std::string> scheduler::check_resumed_outputs(std::span<const int32_t> resumed_output_ids,
                                                            const sampling_params& params) const {
  const int num_resumed = static_cast<int>(resumed_output_ids.size());
  // A request with that many outputs has already ended with finish_reason length: resuming it
  // would send a second final. The router that resumes requests never holds one such.
  if (num_resumed >= params.max_tokens) {
    return std::to_string(num_resumed) + " resumed output tokens already reach max_tokens " +
           std::to_string(params.max_tokens) + ": the request has finished";
  }
  auto contains = [](const std::vector<int32_t>& ids, int32_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  for (int i = 0; i < num_resumed; ++i) {
    const int32_t id = resumed_output_ids[static_cast<size_t>(i)];
    if (id < 0) return "resumed output token " + std::to_string(i) + " is " + std::to_string(id) + ", not a token id";
    if (config_.vocab_size > 0 && id >= config_.vocab_size) {
      return "resumed output token " + std::to_string(i) + " is " + std::to_string(id) +
             ", outside the vocabulary of " + std::to_string(config_.vocab_size);
    }
    if (!params.ignore_eos && contains(eos_token_ids_, id)) {
      return "resumed output token " + std::to_string(i) + " is " + std::to_string(id) +
             ", an eos token that would have finished the request (ignore_eos is off)";
    }
    if (contains(params.stop_token_ids, id)) {
      return "resumed output token " + std::to_string(i) + " is " + std::to_string(id) +
             ", one of stop_token_ids, which would have finished the request";
    }
  }
  return {};
}

std::optional<request_error> scheduler::add_request(int64_t request_id, std::vector<int32_t> prompt_ids,
                                                    sampling_params params, int priority,
                                                    engine_clock::time_point arrival,
                                                    std::span<const int32_t> resumed_output_ids, kv_handoff kv,
                                                    service_targets targets) {
  if (auto error = check_request(request_id, static_cast<int>(prompt_ids.size()), params, resumed_output_ids)) {
    return error;
  }
  auto seq = std::make_unique<sequence>(request_id, std::move(prompt_ids), std::move(params), priority,
                                        next_arrival_order_, arrival, resumed_output_ids, kv, std::move(targets));
  // A role receive request's prompt is computed elsewhere: its TTFT is not this queue's to judge.
  if (config_.slo_admission == slo_admission_mode::reject && kv.role != kv_role::receive) {
    if (auto why = policy_->refusal(*seq, waiting_, running_, clock_now())) {
      ++num_slo_rejections_;
      return request_error{error_code::slo_unattainable, std::move(*why)};
    }
  }
  ++next_arrival_order_;
  waiting_.push_back(seq.get());
  policy_->arrived(*seq);
  sequences_.emplace(request_id, std::move(seq));
  return std::nullopt;
}

step_plan scheduler::schedule() {
  step_plan plan;
  plan.step_id = next_step_id_++;
  // Room for every running sequence and every admission max_num_seqs allows, so the entries
  // are never moved while the plan grows.
  const int admissible =
      std::min(num_waiting(), std::max(0, config_.max_num_seqs - num_running() - num_waiting_for_kv()));
  plan.sequences.reserve(static_cast<size_t>(num_running() + admissible));
  int budget = config_.max_num_batched_tokens;
  bool preempted_any = false;
  const auto now = clock_now();
  policy_->begin_step(now);
  preempt_for_waiting_head(plan);
  // The decodes this step will carry, and the prefill tokens the policy lets ride with them.
  step_shape decodes;
  double tightest_tpot_s = 0;
  for (const sequence* seq : running_) {
    if (!is_decoding(*seq)) continue;
    decodes.add(1, seq->num_scheduled_tokens());
    const double tpot_s = seq->targets().tpot_ms / 1000.0;
    if (tpot_s > 0 && (tightest_tpot_s == 0 || tpot_s < tightest_tpot_s)) tightest_tpot_s = tpot_s;
  }
  int prefill_left = policy_->prefill_token_cap(decodes, tightest_tpot_s);

  for (size_t i = 0; i < running_.size() && budget > 0;) {
    sequence* seq = running_[i];
    // At most one input may be unknown (a placeholder for the step in flight's sample).
    const int plannable = std::min(seq->num_unscheduled_tokens(), seq->num_tokens() + 1 - seq->num_scheduled_tokens());
    const bool prefill = !is_decoding(*seq);
    int num_new = ends_with_pending_sample(*seq) ? 0 : std::min(plannable, budget);
    if (prefill) num_new = std::min(num_new, prefill_left);
    if (num_new <= 0) {
      ++i;
      continue;
    }
    release_behind_window(*seq);
    int slots = draft_slots(*seq, seq->num_scheduled_tokens(), num_new, budget - num_new);
    // Drafts are a bet on speed: when their blocks are not free, the entry goes without them.
    if (slots > 0 && !kv_.can_append(seq->blocks(), seq->num_scheduled_tokens() + num_new + slots)) slots = 0;
    const int needed = seq->num_scheduled_tokens() + num_new + slots;
    bool preempted_self = false;
    while (!kv_.can_append(seq->blocks(), needed)) {
      sequence* victim = running_.back();
      preempt(victim, plan);
      preempted_any = true;
      if (victim == seq) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;
    kv_.append(seq->blocks(), needed);
    plan.sequences.push_back(plan_entry(*seq, num_new, slots));
    seq->planned(plan.sequences.back());
    policy_->charge(*seq, num_new);
    budget -= num_new + slots;
    if (prefill) prefill_left -= num_new;
    ++i;
  }

  // Admitting while preempting would only swap one sequence's blocks for another's.
  while (!preempted_any && !waiting_.empty() && num_running() + num_waiting_for_kv() < config_.max_num_seqs) {
    sequence* seq = policy_->next_waiting(waiting_);
    // A receive request that ran and was preempted since is recomputed from its tokens like any
    // other: its KV came once.
    if (seq->kv().role == kv_role::receive && seq->status() == sequence_status::waiting) {
      // Fresh blocks, not the prefix cache's: the import writes into them, and a cached block
      // may be shared with running requests. The KV costs no compute, so no budget. Tokens
      // handed over already (the prefill side may be quicker than this admission) are not part
      // of the KV: they are the next step's input.
      const int needed = seq->num_tokens() - seq->num_handed_over_tokens();
      if (!kv_.can_allocate(prefix_hit{}, needed)) break;
      kv_.allocate(seq->blocks(), prefix_hit{}, needed);
      seq->reserve_kv(needed, now);
      erase_waiting(seq);
      waiting_for_kv_.push_back(seq);
      new_kv_reservations_.push_back(
          kv_reservation{seq->request_id(), seq->kv().transfer_id, seq->blocks().block_ids, needed, seq->kv().peer});
      continue;
    }
    if (budget <= 0 || prefill_left <= 0) break;
    // Mean pooling needs every prompt token's hidden state, prompt logprobs every prompt row's
    // logits (until the first token carried them): a cached prefix would skip them.
    const bool every_prompt_row = seq->params().pooling == pooling_kind::mean ||
                                  (seq->params().prompt_logprobs >= 0 && seq->num_output_tokens() == 0);
    prefix_hit hit = every_prompt_row ? prefix_hit{} : kv_.find_cached_prefix(seq->token_ids(), seq->block_hashes());
    // Behind a sliding window a sequence is admitted with what fits the window: a longer hit
    // would hold more blocks than a pool sized for the window may have (its head is released
    // only after the first step). Its leading blocks are as good a prefix, recomputed beyond.
    if (config_.kv_window > 0) trim_hit(hit, kv_.blocks_for(config_.kv_window) + 1);
    const int num_new = std::min({seq->num_tokens() - hit.num_tokens, budget, prefill_left});
    int needed = hit.num_tokens + num_new;
    if (!kv_.can_allocate(hit, needed)) break;  // strict order: nobody jumps the head
    // A prompt whose last chunk runs now may already speculate on its first outputs.
    int slots = draft_slots(*seq, hit.num_tokens, num_new, budget - num_new);
    if (slots > 0 && !kv_.can_allocate(hit, needed + slots)) slots = 0;
    needed += slots;
    kv_.allocate(seq->blocks(), hit, needed);
    seq->admit(hit.num_tokens, plan.step_id, now);
    erase_waiting(seq);
    insert_running(seq);
    plan.sequences.push_back(plan_entry(*seq, num_new, slots));
    seq->planned(plan.sequences.back());
    policy_->charge(*seq, num_new);
    budget -= num_new + slots;
    prefill_left -= num_new;
  }
  // An empty plan is not sent: the ids wait for the next one.
  if (!plan.sequences.empty()) {
    plan.finished_ids = std::exchange(finished_since_plan_, {});
    // Listed before this plan's own: the worker drops them before it reads the entries, which
    // may bring them back with a new block table.
    plan.preempted_ids.insert(plan.preempted_ids.begin(), preempted_since_plan_.begin(), preempted_since_plan_.end());
    preempted_since_plan_.clear();
  }
  return plan;
}

bool scheduler::is_decoding(const sequence& seq) {
  // Everything but the last known token (the next input) is computed or being computed.
  return seq.num_scheduled_tokens() >= seq.num_tokens() - 1;
}

void scheduler::preempt_for_waiting_head(step_plan& plan) {
  while (!waiting_.empty() && !running_.empty()) {
    sequence* head = policy_->next_waiting(waiting_);
    if (head->kv().role == kv_role::receive || !policy_->preempts(*head, *running_.back())) return;
    // Room to start its prompt: the first chunk's blocks (a cached prefix only helps).
    const int first_chunk = std::min(head->num_tokens(), config_.max_num_batched_tokens);
    const bool seat = num_running() + num_waiting_for_kv() < config_.max_num_seqs;
    if (seat && kv_.can_allocate(prefix_hit{}, first_chunk)) return;
    preempt(running_.back(), plan);
  }
}

void scheduler::erase_waiting(sequence* seq) { waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq)); }

bool scheduler::ends_with_pending_sample(const sequence& seq) const {
  // The step in flight samples this sequence's last token: a further token would only be
  // thrown away, and could need a block beyond what the request was admitted for.
  if (seq.num_pending_samples() == 0) return false;
  // A prefill-only request is handed off after the sample in flight.
  if (seq.kv().role == kv_role::send) return true;
  // How many tokens a speculating request gains is known only from the result.
  if (requested_drafts(seq) > 0) return true;
  return seq.num_output_tokens() + seq.num_pending_samples() >= seq.params().max_tokens ||
         seq.num_expected_tokens() >= config_.max_model_len;
}

int scheduler::requested_drafts(const sequence& seq) const {
  // A prefill-only request samples one token and leaves: nothing to speculate on.
  if (seq.kv().role == kv_role::send) return 0;
  const int asked = seq.params().num_speculative_tokens;
  return std::min(asked < 0 ? config_.num_speculative_tokens : asked, config_.max_speculative_tokens);
}

int scheduler::draft_slots(const sequence& seq, int first_new_token, int num_new_tokens, int budget_left) const {
  int slots = requested_drafts(seq);
  if (slots <= 0 || first_new_token + num_new_tokens != seq.num_expected_tokens()) return 0;
  // This step yields up to slots + 1 outputs: they must fit max_tokens and max_model_len.
  slots = std::min(slots, budget_left);
  slots = std::min(slots, seq.params().max_tokens - seq.num_output_tokens() - seq.num_pending_samples() - 1);
  slots = std::min(slots, config_.max_model_len - seq.num_expected_tokens() - 1);
  return std::max(slots, 0);
}

scheduled_sequence scheduler::plan_entry(const sequence& seq, int num_new_tokens, int num_draft_slots) const {
  scheduled_sequence s;
  s.request_id = seq.request_id();
  s.num_computed_tokens = seq.num_scheduled_tokens();
  const int begin = seq.num_scheduled_tokens();
  const int end = begin + num_new_tokens;
  // Tokens past the known ones are being sampled by the step in flight (at most one, the last).
  const int known_end = std::min(end, seq.num_tokens());
  auto tokens = seq.token_ids().subspan(static_cast<size_t>(begin), static_cast<size_t>(known_end - begin));
  s.new_token_ids.assign(tokens.begin(), tokens.end());
  if (end > known_end) {
    s.new_token_ids.push_back(-1);
    s.input_from_previous_sample = true;
  }
  const auto& blocks = seq.blocks().block_ids;
  s.block_table_start = std::min(seq.num_blocks_on_worker(), static_cast<int>(blocks.size()));
  s.block_table.assign(blocks.begin() + s.block_table_start, blocks.end());
  s.sample = end == seq.num_expected_tokens();
  s.output_index = seq.num_output_tokens() + seq.num_pending_samples();
  if (s.sample) s.num_draft_slots = num_draft_slots;
  if (s.block_table_start == 0) {
    s.params = seq.params();
    if (seq.kv().role == kv_role::send) s.kv_send_transfer_id = seq.kv().transfer_id;
    s.speculative = requested_drafts(seq) > 0;
    // The worker keeps the history from here on (see scheduled_sequence::penalty_token_ids); a
    // start entry never has a sample pending, so the known tokens are the whole history.
    // A constraint replays the outputs; a proposer reads the whole history.
    // Prompt logprobs judge each prompt row against the prompt's next token.
    if (uses_penalties(seq.params()) || is_guided(seq.params()) || s.speculative || seq.params().prompt_logprobs >= 0 ||
        !seq.params().logits_plugins.empty()) {
      s.penalty_token_ids.assign(seq.token_ids().begin(), seq.token_ids().end());
      s.num_prompt_tokens = seq.num_prompt_tokens();
    }
    // Pooling reads the prompt's rows only.
    if (seq.params().pooling != pooling_kind::none) s.num_prompt_tokens = seq.num_prompt_tokens();
  }
  return s;
}

void scheduler::trim_hit(prefix_hit& hit, int max_blocks) const {
  if (static_cast<int>(hit.block_ids.size()) <= max_blocks) return;
  hit.block_ids.resize(static_cast<size_t>(max_blocks));
  hit.hashes.resize(static_cast<size_t>(max_blocks));
  hit.num_tokens = max_blocks * kv_.block_size();
}

void scheduler::release_behind_window(sequence& seq) {
  // A prefill-only request's KV streams out of its blocks to the decode side: they stay whole.
  if (config_.kv_window <= 0 || seq.kv().role == kv_role::send) return;
  // Steps to come (and any in flight) compute positions from num_computed_tokens on, and a
  // query at position p sees keys from p - window + 1. Only blocks the worker was sent are given
  // back: a released place never reaches it (its copy keeps the old id, which attention no
  // longer reads; the block may meanwhile serve another sequence, whose writes come in later
  // steps than any read of this one's).
  kv_.release_before(seq.blocks(), seq.num_computed_tokens() - config_.kv_window + 1, seq.num_blocks_on_worker());
}

void scheduler::insert_running(sequence* seq) {
  running_.insert(
      std::upper_bound(running_.begin(), running_.end(), seq,
                       [this](const sequence* a, const sequence* b) { return policy_->runs_before(*a, *b); }),
      seq);
}

void scheduler::remove_running(sequence* seq) {
  auto it = std::find(running_.begin(), running_.end(), seq);
  if (it != running_.end()) running_.erase(it);
}

void scheduler::requeue_for_recompute(sequence* seq) {
  remove_running(seq);
  kv_.free(seq->blocks());
  seq->preempt();
  waiting_.push_back(seq);
}

void scheduler::preempt(sequence* seq, step_plan& plan) {
  requeue_for_recompute(seq);
  plan.preempted_ids.push_back(seq->request_id());
}

int scheduler::recompute_all_running() {
  // The lost KV includes every cached prefix's: none may be hit again.
  kv_.forget_cached_prefixes();
  const int count = num_running();
  while (!running_.empty()) {
    sequence* seq = running_.back();
    requeue_for_recompute(seq);
    preempted_since_plan_.push_back(seq->request_id());
  }
  return count;
}

sequence_status scheduler::stop_status(const sampling_params& p, int32_t token_id, int num_output_tokens,
                                       int num_tokens) const {
  auto contains = [token_id](const std::vector<int32_t>& ids) {
    return std::find(ids.begin(), ids.end(), token_id) != ids.end();
  };
  if (!p.ignore_eos && contains(eos_token_ids_)) return sequence_status::finished_stopped;
  if (contains(p.stop_token_ids)) return sequence_status::finished_stopped;
  if (num_output_tokens >= p.max_tokens) return sequence_status::finished_length;
  if (num_tokens >= config_.max_model_len) return sequence_status::finished_length;
  return sequence_status::running;
}

// Called with the token already appended: the counts are the sequence's own.
sequence_status scheduler::stop_status(const sequence& seq, int32_t token_id) const {
  return stop_status(seq.params(), token_id, seq.num_output_tokens(), seq.num_tokens());
}

std::optional<std::string> scheduler::entry_token_count(const step_outline& plan, const planned_sequence& s,
                                                        const step_result& result, size_t next, size_t& count) const {
  const std::string step = "step " + std::to_string(plan.step_id);
  count = 0;
  if (!s.sample) return {};
  if (next >= result.tokens.size()) {
    return step + " returned " + std::to_string(result.tokens.size()) +
           " sampled tokens, the plan samples more (none for request " + std::to_string(s.request_id) + ")";
  }
  const sampled_token& first = result.tokens[next];
  if (first.request_id != s.request_id) {
    return step + " returned its sampled token " + std::to_string(next) + " for request " +
           std::to_string(first.request_id) + ", the plan samples request " + std::to_string(s.request_id) + " there";
  }
  if (first.num_drafts < 0 || first.num_drafts > s.num_draft_slots) {
    return step + " verified " + std::to_string(first.num_drafts) + " drafts for request " +
           std::to_string(s.request_id) + ", which had " + std::to_string(s.num_draft_slots) + " draft slots";
  }
  // The accepted drafts and the target's own token follow with the same id (a plan names a
  // request once, so the next entry's tokens start where the id changes).
  count = 1;
  while (next + count < result.tokens.size() && result.tokens[next + count].request_id == s.request_id) ++count;
  if (count > static_cast<size_t>(first.num_drafts) + 1) {
    return step + " returned " + std::to_string(count) + " tokens for request " + std::to_string(s.request_id) +
           ", more than its " + std::to_string(first.num_drafts) + " drafts and one";
  }
  for (size_t i = next; i < next + count; ++i) {
    const sampled_token& token = result.tokens[i];
    if (token.token_id < 0 || (config_.vocab_size > 0 && token.token_id >= config_.vocab_size)) {
      return step + " sampled token " + std::to_string(token.token_id) + " for request " +
             std::to_string(s.request_id) + ", outside the vocabulary of " + std::to_string(config_.vocab_size);
    }
    if (token.top_token_ids.size() != token.top_logprobs.size()) {
      return step + " returned " + std::to_string(token.top_token_ids.size()) + " top token ids and " +
             std::to_string(token.top_logprobs.size()) + " top logprobs for request " + std::to_string(s.request_id);
    }
    if (i > next && token.num_drafts != 0) {
      return step + " returned a draft count on token " + std::to_string(i - next) + " of request " +
             std::to_string(s.request_id) + " (only its first token carries one)";
    }
  }
  return {};
}

std::optional<std::string> scheduler::check_result(const step_outline& plan, const step_result& result) const {
  if (result.step_id != plan.step_id) {
    return "the result of step " + std::to_string(result.step_id) + " came back for step " +
           std::to_string(plan.step_id);
  }
  size_t next_token = 0;
  for (const planned_sequence& s : plan.sequences) {
    size_t count = 0;
    if (auto why = entry_token_count(plan, s, result, next_token, count)) return why;
    next_token += count;
  }
  if (next_token != result.tokens.size()) {
    size_t num_sampled = 0;
    for (const planned_sequence& s : plan.sequences) num_sampled += s.sample ? 1 : 0;
    return "step " + std::to_string(plan.step_id) + " returned " + std::to_string(result.tokens.size()) +
           " sampled tokens, the plan samples " + std::to_string(num_sampled) + " requests (an extra one for request " +
           std::to_string(result.tokens[next_token].request_id) + ")";
  }
  return {};
}

std::vector<token_delta> scheduler::update(const step_outline& plan, const step_result& result) {
  // All checks first: a result refused halfway would leave some sequences advanced and others not.
  if (auto why = check_result(plan, result)) {
    throw std::invalid_argument("scheduler: " + *why);
  }
  std::vector<token_delta> deltas;
  deltas.reserve(result.tokens.size());
  const auto now = clock_now();
  size_t next_token = 0;
  for (const planned_sequence& s : plan.sequences) {
    size_t count = 0;
    entry_token_count(plan, s, result, next_token, count);  // checked above
    const size_t first_token = next_token;
    next_token += count;
    auto it = sequences_.find(s.request_id);
    if (it == sequences_.end()) continue;  // aborted since the plan
    sequence& seq = *it->second;
    // An entry from before the sequence's preemption (or from an aborted namesake) is stale.
    if (seq.status() != sequence_status::running || plan.step_id < seq.admitted_step() ||
        seq.num_computed_tokens() != s.num_computed_tokens) {
      continue;
    }
    if (count == 0) {
      seq.chunk_computed(s.num_new_tokens);
      kv_.cache_computed_blocks(seq.blocks(), seq.token_ids(), seq.num_computed_tokens());
      continue;
    }
    // The tokens that become outputs: up to the first that ends the request.
    size_t num_outputs = 0;
    sequence_status status = sequence_status::running;
    while (num_outputs < count && !is_finished(status)) {
      const int32_t token_id = result.tokens[first_token + num_outputs].token_id;
      const int num_added = static_cast<int>(++num_outputs);
      status = stop_status(seq.params(), token_id, seq.num_output_tokens() + num_added, seq.num_tokens() + num_added);
    }
    const std::span<const sampled_token> outputs(result.tokens.data() + first_token, num_outputs);
    // For the detokenizer, on the request's first delta from this engine (resumed or not).
    const bool first_delta = seq.num_output_tokens() == seq.num_resumed_output_tokens();
    const bool first_output = seq.num_output_tokens() == 0;
    seq.sample_returned(s.num_new_tokens, result.tokens[first_token].num_drafts, static_cast<int>(count), outputs, now);
    kv_.cache_computed_blocks(seq.blocks(), seq.token_ids(), seq.num_computed_tokens());

    token_delta delta;
    delta.request_id = s.request_id;
    if (first_delta) {
      delta.stop = seq.params().stop;
      delta.skip_special_tokens = seq.params().skip_special_tokens;
    }
    for (size_t i = first_token; i < first_token + outputs.size(); ++i) {
      const sampled_token& token = result.tokens[i];
      delta.token_ids.push_back(token.token_id);
      if (!token.embedding.empty()) delta.embedding = token.embedding;
      if (seq.params().prompt_logprobs >= 0 && i == first_token && first_output) {
        delta.prompt_logprobs = token.prompt_logprobs;
      }
      if (seq.params().logprobs >= 0) {
        delta.logprobs.push_back({token.logprob, token.top_token_ids, token.top_logprobs});
      }
    }
    if (is_finished(status)) {
      token_delta last = finish(seq, status, now);  // destroys seq
      delta.finish = last.finish;
      delta.metrics = last.metrics;
    } else if (seq.kv().role == kv_role::send) {
      delta.handed_off = true;
      delta.kv_transfer_id = seq.kv().transfer_id;
      release(seq, seq.status());  // destroys seq: the decode instance goes on with it
    }
    deltas.push_back(std::move(delta));
  }
  return deltas;
}

std::optional<token_delta> scheduler::abort(int64_t request_id) {
  auto it = sequences_.find(request_id);
  if (it == sequences_.end()) return std::nullopt;
  return finish(*it->second, sequence_status::finished_aborted, clock_now());
}

std::optional<token_delta> scheduler::stop(int64_t request_id) {
  auto it = sequences_.find(request_id);
  if (it == sequences_.end()) return std::nullopt;
  return finish(*it->second, sequence_status::finished_stopped, clock_now());
}

token_delta scheduler::finish(sequence& seq, sequence_status status, engine_clock::time_point now) {
  const sequence_status queued_as = seq.status();
  seq.finish(status, now);
  token_delta delta;
  delta.request_id = seq.request_id();
  delta.finish = finish_reason_of(status);
  delta.metrics = seq.metrics();
  release(seq, queued_as);
  return delta;
}

void scheduler::release(sequence& seq, sequence_status queued_as) {
  if (queued_as == sequence_status::running) {
    remove_running(&seq);
  } else if (queued_as == sequence_status::waiting_for_kv) {
    waiting_for_kv_.erase(std::find(waiting_for_kv_.begin(), waiting_for_kv_.end(), &seq));
  } else {
    erase_waiting(&seq);
  }
  policy_->left(seq);
  kv_.free(seq.blocks());
  if (seq.known_to_worker()) finished_since_plan_.push_back(seq.request_id());
  sequences_.erase(seq.request_id());
}

bool scheduler::kv_arrived(int64_t request_id, uint64_t transfer_id) {
  auto it = sequences_.find(request_id);
  if (it == sequences_.end() || it->second->status() != sequence_status::waiting_for_kv ||
      it->second->kv().transfer_id != transfer_id) {
    return false;
  }
  it->second->kv_complete();
  start_if_ready(*it->second);
  return true;
}

std::optional<std::string> scheduler::hand_over(int64_t request_id, uint64_t transfer_id,
                                                std::span<const int32_t> token_ids) {
  auto it = sequences_.find(request_id);
  if (it == sequences_.end() || it->second->kv().role != kv_role::receive || it->second->handed_off() ||
      it->second->kv().transfer_id != transfer_id) {
    return {};
  }
  sequence& seq = *it->second;
  if (token_ids.empty()) return "request " + std::to_string(request_id) + ": the prefill side handed over no token";
  // Every token is checked before any is appended, so a refused hand-over leaves the sequence
  // as it was (the caller fails the request; nothing half-changed is left for the abort path).
  for (size_t i = 0; i < token_ids.size(); ++i) {
    const int32_t id = token_ids[i];
    if (id < 0 || (config_.vocab_size > 0 && id >= config_.vocab_size)) {
      return "request " + std::to_string(request_id) + ": the prefill side handed over token " + std::to_string(id) +
             ", outside the vocabulary of " + std::to_string(config_.vocab_size);
    }
    const int tokens_before = seq.num_tokens() + static_cast<int>(i);
    if (tokens_before >= config_.max_model_len) {
      return "request " + std::to_string(request_id) + ": the handed-over tokens pass max_model_len " +
             std::to_string(config_.max_model_len);
    }
    const int outputs_after = seq.num_output_tokens() + static_cast<int>(i) + 1;
    if (is_finished(stop_status(seq.params(), id, outputs_after, tokens_before + 1))) {
      return "request " + std::to_string(request_id) + ": the prefill side handed over token " + std::to_string(id) +
             ", which ends the request (the prefill side should have finished it)";
    }
  }
  seq.hand_over(token_ids, clock_now());
  if (seq.status() == sequence_status::waiting_for_kv) start_if_ready(seq);
  return {};
}

void scheduler::start_if_ready(sequence& seq) {
  if (!seq.ready_to_start()) return;
  seq.start_from_kv(next_step_id_);
  waiting_for_kv_.erase(std::find(waiting_for_kv_.begin(), waiting_for_kv_.end(), &seq));
  kv_.cache_computed_blocks(seq.blocks(), seq.token_ids(), seq.num_computed_tokens());
  insert_running(&seq);
}

const sequence* scheduler::find(int64_t request_id) const {
  auto it = sequences_.find(request_id);
  return it == sequences_.end() ? nullptr : it->second.get();
}

}  // namespace troupe
