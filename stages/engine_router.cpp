#include "stages/engine_router.hpp"

#include <algorithm>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {

constexpr size_t max_early_aborts = 4096;
constexpr size_t max_prefix_owners = 1 << 16;
// A running sequence's weight against queued prompt tokens: each step it takes a slot of the
// token budget, and a new request's prefill shares the steps with it.
constexpr int64_t running_sequence_cost = 16;
// Added when the instance reported too few free blocks for the prompt: it would queue there.
constexpr int64_t full_pool_cost = int64_t(1) << 40;

}  // namespace

engine_router::engine_router(int block_size, failover_wait_settings wait, pair_admission_settings admission)
    // Transfer ids start at random: a receiver refuses frames of a transfer it does not expect,
    // and ids of a restarted controller must not meet a late frame of its predecessor's.
    : block_size_(std::max(1, block_size)),
      wait_(wait),
      admission_(admission),
      next_transfer_id_((std::random_device{}() | 1ull) << 20) {}

engine_instance_id engine_router::add_instance(std::string node, engine_role role, std::string quantization) {
  const engine_instance_id id = next_id_++;
  instances_[id].node = std::move(node);
  instances_[id].role = role;
  instances_[id].quantization = std::move(quantization);
  for (waiting_request& waiting : waiting_) commands_.reruns.push_back(std::move(waiting.request));
  waiting_.clear();
  return id;
}

bool engine_router::wait_for_instance(const schedule_request& request, timestamp_ns now) {
  if (is_waiting(request.request_id)) return true;  // tokenized twice: it waits once
  if (wait_.bound.count() <= 0 || waiting_.size() >= wait_.max_waiting) {
    drop(request.request_id);
    return false;
  }
  waiting_request waiting;
  waiting.request = request;
  waiting.request.kv = {};
  waiting.deadline = now + std::chrono::duration_cast<std::chrono::nanoseconds>(wait_.bound).count();
  waiting_.push_back(std::move(waiting));
  return true;
}

bool engine_router::is_waiting(int64_t request_id) const {
  return std::any_of(waiting_.begin(), waiting_.end(),
                     [&](const waiting_request& w) { return w.request.request_id == request_id; });
}

std::optional<timestamp_ns> engine_router::next_wait_deadline() const {
  if (waiting_.empty()) return std::nullopt;
  return waiting_.front().deadline;
}

std::optional<timestamp_ns> engine_router::wait_timer_to_set() {
  if (wait_timer_set_ || waiting_.empty()) return std::nullopt;
  wait_timer_set_ = true;
  return waiting_.front().deadline;
}

void engine_router::expire_waiting(timestamp_ns now) {
  while (!waiting_.empty() && waiting_.front().deadline <= now) {
    const int64_t id = waiting_.front().request.request_id;
    waiting_.pop_front();
    drop(id);  // a re-run's record: what it streamed is of no use now
    commands_.failures.push_back(
        request_failed{id, error_code::unavailable,
                       "no engine instance is available: none came back within failover_wait_ms (" +
                           std::to_string(wait_.bound.count()) + " ms)"});
  }
}

bool engine_router::end_waiting(int64_t request_id, finish_reason reason) {
  auto it = std::find_if(waiting_.begin(), waiting_.end(),
                         [&](const waiting_request& w) { return w.request.request_id == request_id; });
  if (it == waiting_.end()) return false;
  // The final delta an instance would send for a request it ends before its next token.
  token_delta end;
  end.request_id = request_id;
  end.finish = reason;
  request_metrics metrics;
  metrics.num_prompt_tokens = static_cast<int>(it->request.prompt_ids.size());
  metrics.num_output_tokens = static_cast<int>(it->request.resumed_output_ids.size());
  end.metrics = metrics;
  commands_.ended.deltas.push_back(std::move(end));
  commands_.ended.timelines.emplace_back();
  waiting_.erase(it);
  drop(request_id);
  return true;
}

std::vector<int64_t> engine_router::waiting_requests() const {
  std::vector<int64_t> ids;
  for (const waiting_request& w : waiting_) ids.push_back(w.request.request_id);
  return ids;
}

void engine_router::set_load(engine_instance_id id, const engine_load& load) {
  auto it = instances_.find(id);
  if (it != instances_.end()) it->second.load = load;
}

std::optional<uint64_t> engine_router::first_block_hash(const std::vector<int32_t>& prompt) const {
  // Only a full block can be shared from the prefix cache.
  if (prompt.size() <= static_cast<size_t>(block_size_)) return std::nullopt;
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the ids
  for (int i = 0; i < block_size_; ++i) {
    hash ^= static_cast<uint32_t>(prompt[i]);
    hash *= 1099511628211ull;
  }
  return hash;
}

int64_t engine_router::cost(const instance_record& instance, int num_prompt_blocks) const {
  int64_t total = instance.num_queued_prompt_tokens + running_sequence_cost * instance.num_started;
  // A report of zero total blocks means none came yet: nothing to judge by.
  if (instance.load.num_total_blocks > 0 && instance.load.num_free_blocks < num_prompt_blocks) total += full_pool_cost;
  return total;
}

std::optional<engine_instance_id> engine_router::pick(std::initializer_list<engine_role> roles,
                                                      const schedule_request& request, int num_blocks,
                                                      bool use_prefix_affinity,
                                                      const std::vector<engine_instance_id>& behind) {
  std::vector<engine_instance_id> ids;
  for (const auto& [id, instance] : instances_) {
    if (instance.state == engine_state::active && std::find(roles.begin(), roles.end(), instance.role) != roles.end() &&
        std::find(behind.begin(), behind.end(), id) == behind.end()) {
      ids.push_back(id);
    }
  }
  if (ids.empty()) return std::nullopt;
  std::sort(ids.begin(), ids.end());
  // Each instance's work ahead in tokens, weighed by what a token costs there (its step-time
  // model, reported with its load), so a slower instance's queue counts for more. An instance
  // that has not measured enough steps yet counts as the candidates' mean; with none measured,
  // or all alike, the order is the tokens' own.
  double known_sum = 0;
  int num_known = 0;
  for (engine_instance_id id : ids) {
    const double s = instances_.at(id).load.seconds_per_prompt_token;
    if (s > 0) {
      known_sum += s;
      ++num_known;
    }
  }
  const double unknown = num_known > 0 ? known_sum / num_known : 1.0;
  auto token_seconds = [&](engine_instance_id id) {
    const double s = instances_.at(id).load.seconds_per_prompt_token;
    return s > 0 ? s : unknown;
  };
  auto weighed = [&](engine_instance_id id) {
    return static_cast<double>(cost(instances_.at(id), num_blocks)) * token_seconds(id);
  };
  // Ties go round the instances in id order, starting after the last one picked.
  const size_t start = next_tie_break_++;
  std::optional<engine_instance_id> best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < ids.size(); ++i) {
    const engine_instance_id id = ids[(start + i) % ids.size()];
    const double c = weighed(id);
    if (c < best_cost) {
      best_cost = c;
      best = id;
    }
  }
  if (!use_prefix_affinity) return best;
  const std::optional<uint64_t> prefix = first_block_hash(request.prompt_ids);
  if (prefix) {
    auto owner = prefix_owner_.find(*prefix);
    if (owner != prefix_owner_.end() && owner->second != *best &&
        std::find(ids.begin(), ids.end(), owner->second) != ids.end()) {
      // Worth it while the extra work queued there is less than the prefill a cache hit saves.
      if (weighed(owner->second) - best_cost < block_size_ * token_seconds(owner->second)) best = owner->second;
    }
    note_prefix_owner(request, *best);
  }
  return best;
}

void engine_router::note_prefix_owner(const schedule_request& request, engine_instance_id id) {
  const std::optional<uint64_t> prefix = first_block_hash(request.prompt_ids);
  if (!prefix) return;
  if (prefix_owner_.size() >= max_prefix_owners) prefix_owner_.clear();
  prefix_owner_[*prefix] = id;
}

std::vector<engine_instance_id> engine_router::decode_instances_behind(timestamp_ns now,
                                                                       duration_ns& least_wait) const {
  std::vector<engine_instance_id> behind;
  least_wait = std::numeric_limits<duration_ns>::max();
  if (admission_.reservation_wait_bound.count() <= 0) return behind;
  const duration_ns bound =
      std::chrono::duration_cast<std::chrono::nanoseconds>(admission_.reservation_wait_bound).count();
  for (const auto& [id, instance] : instances_) {
    if (instance.role != engine_role::decode || instance.state != engine_state::active) continue;
    if (instance.awaiting_blocks.size() <= admission_.min_backlog) continue;
    const duration_ns waited = now - instance.awaiting_blocks.begin()->first;
    if (waited <= bound) continue;
    behind.push_back(id);
    least_wait = std::min(least_wait, waited);
  }
  return behind;
}

bool engine_router::any_active(std::initializer_list<engine_role> roles) const {
  return std::any_of(instances_.begin(), instances_.end(), [&](const auto& entry) {
    return entry.second.state == engine_state::active &&
           std::find(roles.begin(), roles.end(), entry.second.role) != roles.end();
  });
}

std::optional<engine_instance_id> engine_router::ask_policy(std::initializer_list<engine_role> roles,
                                                            const schedule_request& request) {
  std::optional<engine_instance_id> prefix_owner;
  const std::optional<uint64_t> prefix = first_block_hash(request.prompt_ids);
  if (prefix) {
    if (auto owner = prefix_owner_.find(*prefix); owner != prefix_owner_.end()) prefix_owner = owner->second;
  }
  std::vector<route_candidate> candidates;
  for (const auto& [id, instance] : instances_) {
    if (std::find(roles.begin(), roles.end(), instance.role) == roles.end()) continue;
    route_candidate c;
    c.id = id;
    c.node = instance.node;
    c.role = instance.role;
    c.state = instance.state;
    c.load = instance.load;
    c.num_requests = instance.num_requests;
    c.num_queued_prompt_tokens = instance.num_queued_prompt_tokens;
    // What the router knows: the instance that last computed the prompt's first block holds it.
    if (prefix) c.prefix_hit_tokens = prefix_owner == id ? block_size_ : 0;
    candidates.push_back(std::move(c));
  }
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  route_query query;
  query.request_id = request.request_id;
  query.tenant = request.targets.tenant;
  query.num_prompt_ids = request.prompt_ids.size();
  query.num_resumed_ids = request.resumed_output_ids.size();
  const route_decision decision = policy_->choose(query, candidates);
  switch (decision.what) {
    case route_decision::kind::no_opinion: return std::nullopt;
    case route_decision::kind::failed:
      throw std::runtime_error(decision.message.empty() ? policy_->name() + " failed to route the request"
                                                        : decision.message);
    case route_decision::kind::chosen: break;
  }
  // Checked here too: a policy's wrong answer fails its request, never the router.
  if (decision.index >= candidates.size()) {
    throw std::runtime_error(policy_->name() + " chose candidate " + std::to_string(decision.index) + " of " +
                             std::to_string(candidates.size()));
  }
  const route_candidate& chosen = candidates[decision.index];
  if (chosen.state != engine_state::active) {
    throw std::runtime_error(policy_->name() + " chose engine instance " + std::to_string(chosen.id) +
                             ", which is draining and takes no new request");
  }
  return chosen.id;
}

void engine_router::charge(request_record& record) {
  const int64_t num_tokens = static_cast<int64_t>(record.request.prompt_ids.size() + record.streamed.size());
  record.charged_tokens = num_tokens;
  auto charge_queued = [&](engine_instance_id id) {
    auto it = instances_.find(id);
    if (it == instances_.end()) return;
    ++it->second.num_requests;
    it->second.num_queued_prompt_tokens += num_tokens;
  };
  auto charge_started = [&](engine_instance_id id) {
    auto it = instances_.find(id);
    if (it == instances_.end()) return;
    ++it->second.num_requests;
    ++it->second.num_started;
  };
  if (record.transfer_id != 0 && !record.handed_off) {
    // The prefill half queues its prompt; the decode half will run a sequence.
    charge_queued(record.prefill);
    charge_started(record.decode);
  } else if (record.instance >= 0) {
    if (record.started) {
      charge_started(record.instance);
    } else {
      charge_queued(record.instance);
    }
  }
}

void engine_router::uncharge(request_record& record) {
  const int64_t num_tokens = record.charged_tokens;
  auto uncharge_queued = [&](engine_instance_id id) {
    auto it = instances_.find(id);
    if (it == instances_.end()) return;
    --it->second.num_requests;
    it->second.num_queued_prompt_tokens -= num_tokens;
  };
  auto uncharge_started = [&](engine_instance_id id) {
    auto it = instances_.find(id);
    if (it == instances_.end()) return;
    --it->second.num_requests;
    --it->second.num_started;
  };
  if (record.transfer_id != 0 && !record.handed_off) {
    uncharge_queued(record.prefill);
    uncharge_started(record.decode);
  } else if (record.instance >= 0) {
    if (record.started) {
      uncharge_started(record.instance);
    } else {
      uncharge_queued(record.instance);
    }
  }
}

std::optional<engine_router::routed> engine_router::route(const schedule_request& request, timestamp_ns now) {
  const int64_t num_tokens = static_cast<int64_t>(request.prompt_ids.size() + request.resumed_output_ids.size());
  const int num_blocks = static_cast<int>((num_tokens + block_size_ - 1) / block_size_);
  route_error_.clear();
  route_error_code_ = error_code::internal;
  routed where;
  // The route policy chooses the instance that computes the prompt, among those of the roles the
  // built-in policy would pick from (below), before it does.
  std::optional<engine_instance_id> chosen;
  if (policy_) {
    const bool pair = any_active({engine_role::prefill}) && any_active({engine_role::decode});
    const bool whole = any_active({engine_role::mixed, engine_role::decode});
    try {
      if (pair) {
        chosen = ask_policy({engine_role::prefill}, request);
      } else if (whole) {
        chosen = ask_policy({engine_role::mixed, engine_role::decode}, request);
      } else if (any_active({engine_role::prefill})) {
        chosen = ask_policy({engine_role::prefill}, request);
      }
    } catch (const std::exception& e) {
      route_error_ = e.what();
      return std::nullopt;
    }
    if (chosen) note_prefix_owner(request, *chosen);
  }
  const bool chosen_prefill = chosen && instances_.at(*chosen).role == engine_role::prefill;
  std::optional<engine_instance_id> prefill =
      chosen ? (chosen_prefill ? chosen : std::nullopt) : pick({engine_role::prefill}, request, num_blocks, true);
  duration_ns least_wait = 0;
  const std::vector<engine_instance_id> behind =
      prefill ? decode_instances_behind(now, least_wait) : std::vector<engine_instance_id>{};
  std::optional<engine_instance_id> decode =
      prefill ? pick({engine_role::decode}, request, num_blocks, false, behind) : std::nullopt;
  if (prefill && !decode && !behind.empty() && !any_active({engine_role::mixed})) {
    // Every decode instance is behind: a request sent now would wait past its transfer's
    // deadline, and computing it whole on a decode instance adds to what it cannot keep up with.
    route_error_code_ = error_code::overloaded;
    ++num_overload_refusals_;
    route_error_ = "the decode instances are behind: their oldest request has waited " +
                   std::to_string((least_wait + 999'999) / 1'000'000) + " ms for KV blocks, past [disaggregation] " +
                   "reservation_wait_ms (" + std::to_string(admission_.reservation_wait_bound.count()) +
                   " ms); try again shortly";
    return std::nullopt;
  }
  if (prefill && decode) {
    where.instance = *prefill;
    where.decode = *decode;
    where.transfer_id = next_transfer_id_++;
  } else if (chosen) {
    where.instance = *chosen;
  } else {
    // No pair: a mixed or decode instance computes it whole; a prefill instance only when
    // nothing else is left.
    std::optional<engine_instance_id> whole =
        pick({engine_role::mixed, engine_role::decode}, request, num_blocks, true, behind);
    if (!whole) whole = pick({engine_role::prefill}, request, num_blocks, true);
    if (!whole) return std::nullopt;
    where.instance = *whole;
  }

  auto [it, fresh] = requests_.try_emplace(request.request_id);
  request_record& record = it->second;
  if (fresh) {
    record.request = request;
    record.request.kv = {};
    record.streamed = request.resumed_output_ids;
  } else {
    ++record.attempt;  // run again (run_again): what the earlier run still sends is not this one's
  }
  where.attempt = record.attempt;
  // A re-run left its old instances in run_again, so it is charged nowhere now.
  record.instance = where.instance;
  record.started = false;
  record.transfer_id = where.transfer_id;
  record.prefill = where.decode ? where.instance : -1;
  record.decode = where.decode.value_or(-1);
  record.handed_off = false;
  record.kv_landed = false;
  record.kv_reserved = false;
  record.routed_at = now;
  charge(record);
  if (record.transfer_id != 0) instances_.at(record.decode).awaiting_blocks.emplace(now, request.request_id);
  where.aborted_early = early_aborts_.erase(request.request_id) > 0;
  return where;
}

void engine_router::stop_awaiting_blocks(request_record& record) {
  if (record.transfer_id == 0 || record.kv_reserved) return;
  record.kv_reserved = true;
  if (auto it = instances_.find(record.decode); it != instances_.end()) {
    it->second.awaiting_blocks.erase({record.routed_at, record.request.request_id});
  }
}

void engine_router::forget(std::unordered_map<int64_t, request_record>::iterator it) {
  stop_awaiting_blocks(it->second);
  uncharge(it->second);
  requests_.erase(it);
}

void engine_router::run_again(std::unordered_map<int64_t, request_record>::iterator it, engine_instance_id except) {
  request_record& record = it->second;
  for (engine_instance_id holder : holders_of(it->first)) {
    if (holder != except && instances_.count(holder)) commands_.aborts.emplace_back(holder, it->first);
  }
  stop_awaiting_blocks(record);
  uncharge(record);
  record.instance = -1;  // on no instance until routed again
  record.started = false;
  record.transfer_id = 0;
  record.prefill = record.decode = -1;
  record.handed_off = record.kv_landed = record.kv_reserved = false;
  schedule_request again = record.request;
  again.resumed_output_ids = record.streamed;
  commands_.reruns.push_back(std::move(again));
}

token_batch engine_router::on_tokens(engine_instance_id from, token_batch batch) {
  auto instance = instances_.find(from);
  if (instance == instances_.end()) return {};  // a lost instance's late batch
  instance->second.load = batch.load;
  token_batch out;
  out.load = batch.load;
  for (size_t i = 0; i < batch.deltas.size(); ++i) {
    token_delta& delta = batch.deltas[i];
    auto it = requests_.find(delta.request_id);
    if (it == requests_.end()) continue;
    request_record& record = it->second;
    // An earlier run's delta, sent before the abort of that run reached its instance: this one
    // is on its way from the same instance or another, and its tokens are not these.
    if (delta.attempt != record.attempt) continue;
    const bool prefill_half = record.transfer_id != 0 && !record.handed_off;
    if (record.instance != from) {
      // The decode half ended the request before the hand-off: an abort reached it first (a
      // client's abort goes to both halves). Its end is the request's one terminal reply; the
      // prefill half's hand-off, if it comes, finds no request and is dropped. Dropping this
      // end instead left the client with a first token and no final reply, and the request
      // counted in flight forever (issue 25: 2 of 120 generate/abort pairs in 1P1D).
      if (!(prefill_half && from == record.decode && delta.finished())) continue;
      commands_.aborts.emplace_back(record.prefill, delta.request_id);
      forget(it);
      out.deltas.push_back(std::move(delta));
      out.timelines.push_back(std::move(batch.timelines[i]));
      continue;
    }
    if (delta.handed_off && !(prefill_half && delta.kv_transfer_id == record.transfer_id)) {
      // The hand-off of an earlier attempt (its other half was lost and the request runs again,
      // perhaps on this very instance): its token is not this attempt's.
      continue;
    }
    record.streamed.insert(record.streamed.end(), delta.token_ids.begin(), delta.token_ids.end());
    if (prefill_half && delta.finished()) {
      // Ended at its first token: the decode half's reservation is for nothing.
      commands_.aborts.emplace_back(record.decode, delta.request_id);
    } else if (prefill_half && delta.handed_off) {
      uncharge(record);
      record.handed_off = true;
      record.instance = record.decode;
      record.started = true;
      charge(record);
      commands_.handovers.emplace_back(record.decode,
                                       kv_handover_msg{delta.request_id, record.transfer_id, delta.token_ids});
      delta.handed_off = false;  // downstream, it is an ordinary delta
    } else if (!record.started && (!delta.token_ids.empty() || delta.finished())) {
      uncharge(record);
      record.started = true;
      charge(record);
    }
    if (delta.finished()) forget(it);
    out.deltas.push_back(std::move(delta));
    out.timelines.push_back(std::move(batch.timelines[i]));
  }
  for (request_failed& failure : batch.failures) {
    auto it = requests_.find(failure.request_id);
    if (it == requests_.end()) continue;
    // From the request's instance, or (as a finished delta above) from its decode half before
    // the hand-off: either half's failure is the request's end.
    const bool decode_half_before_hand_off =
        it->second.transfer_id != 0 && !it->second.handed_off && it->second.decode == from;
    if (it->second.instance != from && !decode_half_before_hand_off) continue;
    for (engine_instance_id holder : holders_of(failure.request_id)) {
      if (holder != from) commands_.aborts.emplace_back(holder, failure.request_id);
    }
    forget(it);
    out.failures.push_back(std::move(failure));
  }
  // Each finished request's access log line names the instance that ended it.
  for (size_t i = 0; i < out.deltas.size(); ++i) {
    if (out.deltas[i].finished()) out.timelines[i].instance = from;
  }
  return out;
}

bool engine_router::on_refusal(engine_instance_id from, const request_failed& refusal) {
  auto it = requests_.find(refusal.request_id);
  if (it == requests_.end()) return false;
  const std::vector<engine_instance_id> holders = holders_of(refusal.request_id);
  if (std::find(holders.begin(), holders.end(), from) == holders.end()) return false;
  for (engine_instance_id holder : holders) {
    if (holder != from) commands_.aborts.emplace_back(holder, refusal.request_id);
  }
  forget(it);
  return true;
}

std::optional<engine_instance_id> engine_router::instance_of(int64_t request_id) const {
  auto it = requests_.find(request_id);
  if (it == requests_.end() || it->second.instance < 0) return std::nullopt;
  return it->second.instance;
}

std::vector<engine_instance_id> engine_router::holders_of(int64_t request_id) const {
  std::vector<engine_instance_id> holders;
  auto it = requests_.find(request_id);
  if (it == requests_.end() || it->second.instance < 0) return holders;
  holders.push_back(it->second.instance);
  const request_record& record = it->second;
  if (record.transfer_id != 0 && !record.handed_off) holders.push_back(record.decode);
  return holders;
}

std::optional<engine_instance_id> engine_router::on_kv_ready(engine_instance_id from, const kv_ready_msg& ready) {
  auto it = requests_.find(ready.request_id);
  if (it == requests_.end() || it->second.transfer_id != ready.transfer_id || it->second.decode != from) {
    return std::nullopt;
  }
  if (!instances_.count(it->second.prefill)) return std::nullopt;
  stop_awaiting_blocks(it->second);
  return it->second.prefill;
}

void engine_router::on_kv_landed(engine_instance_id from, const kv_arrival_msg& arrival) {
  auto it = requests_.find(arrival.request_id);
  if (it == requests_.end() || it->second.transfer_id != arrival.transfer_id || it->second.decode != from) return;
  it->second.kv_landed = true;
}

void engine_router::on_kv_failed(engine_instance_id from, const kv_failed_msg& failed) {
  auto it = requests_.find(failed.request_id);
  if (it == requests_.end() || it->second.transfer_id != failed.transfer_id || it->second.decode != from) return;
  transfer_failed(it, from, failed.why);
}

void engine_router::on_kv_send_failed(engine_instance_id from, const kv_failed_msg& failed) {
  if (failed.transfer_id == 0) return;
  auto it = std::find_if(requests_.begin(), requests_.end(), [&](const auto& entry) {
    return entry.second.transfer_id == failed.transfer_id && entry.second.prefill == from;
  });
  if (it == requests_.end()) return;
  // The prefill half may still hold the request (a transfer refused mid-prompt): it goes too.
  transfer_failed(it, -1, failed.why);
}

void engine_router::transfer_failed(std::unordered_map<int64_t, request_record>::iterator it, engine_instance_id except,
                                    const std::string& why) {
  const int64_t request_id = it->first;
  if (++it->second.transfer_attempts < max_transfer_attempts) {
    run_again(it, except);
    return;
  }
  for (engine_instance_id holder : holders_of(request_id)) {
    if (holder != except) commands_.aborts.emplace_back(holder, request_id);
  }
  commands_.failures.push_back(request_failed{
      request_id, error_code::internal,
      "the request's KV transfer failed " + std::to_string(max_transfer_attempts) + " times; the last: " + why});
  forget(it);
}

void engine_router::abort_unrouted(int64_t request_id) {
  if (!early_aborts_.insert(request_id).second) return;
  early_abort_order_.push_back(request_id);
  while (early_abort_order_.size() > max_early_aborts) {
    early_aborts_.erase(early_abort_order_.front());
    early_abort_order_.pop_front();
  }
}

void engine_router::drop(int64_t request_id) {
  auto it = requests_.find(request_id);
  if (it != requests_.end()) forget(it);
}

std::vector<schedule_request> engine_router::remove_instance(engine_instance_id id) {
  if (!instances_.count(id)) return {};
  std::vector<schedule_request> before = std::exchange(commands_.reruns, {});
  for (auto it = requests_.begin(); it != requests_.end(); ++it) {
    const request_record& record = it->second;
    const bool disaggregated = record.transfer_id != 0;
    const bool affected = record.instance == id ||
                          (disaggregated && !record.handed_off && (record.prefill == id || record.decode == id)) ||
                          // Handed off, but the KV is still on its way from the lost prefill half: it never comes.
                          (disaggregated && record.handed_off && record.prefill == id && !record.kv_landed);
    if (affected) run_again(it, id);
  }
  instances_.erase(id);
  std::vector<schedule_request> reruns = std::exchange(commands_.reruns, std::move(before));
  // Oldest first (a controller's ids grow with time): the re-runs keep their order in the new queue.
  std::sort(reruns.begin(), reruns.end(),
            [](const schedule_request& a, const schedule_request& b) { return a.request_id < b.request_id; });
  for (auto it = prefix_owner_.begin(); it != prefix_owner_.end();) {
    it = it->second == id ? prefix_owner_.erase(it) : std::next(it);
  }
  return reruns;
}

bool engine_router::drain(engine_instance_id id) {
  auto it = instances_.find(id);
  if (it == instances_.end()) return false;
  it->second.state = engine_state::draining;
  return true;
}

std::vector<engine_instance_id> engine_router::drain_node(const std::string& node) {
  std::vector<engine_instance_id> drained;
  for (auto& [id, record] : instances_) {
    if (record.node != node || record.state != engine_state::active) continue;
    record.state = engine_state::draining;
    drained.push_back(id);
  }
  std::sort(drained.begin(), drained.end());
  return drained;
}

bool engine_router::drained(engine_instance_id id) const {
  auto it = instances_.find(id);
  return it != instances_.end() && it->second.state == engine_state::draining && it->second.num_requests == 0;
}

std::vector<std::pair<int64_t, engine_instance_id>> engine_router::routed_requests() const {
  std::vector<std::pair<int64_t, engine_instance_id>> out;
  for (const auto& [id, record] : requests_) {
    for (engine_instance_id holder : holders_of(id)) {
      if (instances_.count(holder)) out.emplace_back(id, holder);
    }
  }
  return out;
}

std::vector<engine_instance_info> engine_router::instances() const {
  std::vector<engine_instance_info> out;
  for (const auto& [id, instance] : instances_) {
    engine_instance_info info;
    info.id = id;
    info.node = instance.node;
    info.state = instance.state;
    info.role = instance.role;
    info.num_requests = instance.num_requests;
    info.num_queued_prompt_tokens = instance.num_queued_prompt_tokens;
    info.load = instance.load;
    info.quantization = instance.quantization;
    info.num_awaiting_blocks = static_cast<int32_t>(instance.awaiting_blocks.size());
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

}  // namespace troupe
