#include "stages/engine_router.hpp"

#include <algorithm>
#include <limits>

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

engine_router::engine_router(int block_size) : block_size_(std::max(1, block_size)) {}

engine_instance_id engine_router::add_instance(std::string node) {
  const engine_instance_id id = next_id_++;
  instances_[id].node = std::move(node);
  return id;
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

std::optional<engine_router::routed> engine_router::route(const schedule_request& request) {
  const int64_t num_tokens = static_cast<int64_t>(request.prompt_ids.size() + request.resumed_output_ids.size());
  const int num_blocks = static_cast<int>((num_tokens + block_size_ - 1) / block_size_);
  std::optional<engine_instance_id> best;
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  // Ties go round the instances in id order, starting after the last one picked.
  const size_t start = next_tie_break_++;
  std::vector<engine_instance_id> ids;
  for (const auto& [id, instance] : instances_) {
    if (instance.state == engine_state::active) ids.push_back(id);
  }
  if (ids.empty()) return std::nullopt;
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size(); ++i) {
    const engine_instance_id id = ids[(start + i) % ids.size()];
    const int64_t c = cost(instances_.at(id), num_blocks);
    if (c < best_cost) {
      best_cost = c;
      best = id;
    }
  }
  const std::optional<uint64_t> prefix = first_block_hash(request.prompt_ids);
  if (prefix) {
    auto owner = prefix_owner_.find(*prefix);
    if (owner != prefix_owner_.end() && owner->second != *best) {
      auto it = instances_.find(owner->second);
      // Worth it while the extra work queued there is less than the prefill a cache hit saves.
      if (it != instances_.end() && it->second.state == engine_state::active &&
          cost(it->second, num_blocks) - best_cost < block_size_) {
        best = owner->second;
      }
    }
    if (prefix_owner_.size() >= max_prefix_owners) prefix_owner_.clear();
    prefix_owner_[*prefix] = *best;
  }

  instance_record& instance = instances_.at(*best);
  auto [it, fresh] = requests_.try_emplace(request.request_id);
  request_record& record = it->second;
  if (!fresh) {
    // A re-run: it left its old instance in remove_instance, so it counts nowhere now.
    record.instance = *best;
    record.started = false;
  } else {
    record.instance = *best;
    record.request = request;
    record.streamed = request.resumed_output_ids;
  }
  ++instance.num_requests;
  instance.num_queued_prompt_tokens += num_tokens;
  const bool aborted_early = early_aborts_.erase(request.request_id) > 0;
  return routed{*best, aborted_early};
}

void engine_router::forget(std::unordered_map<int64_t, request_record>::iterator it) {
  auto instance = instances_.find(it->second.instance);
  if (instance != instances_.end()) {
    --instance->second.num_requests;
    if (it->second.started) {
      --instance->second.num_started;
    } else {
      instance->second.num_queued_prompt_tokens -=
          static_cast<int64_t>(it->second.request.prompt_ids.size() + it->second.streamed.size());
    }
  }
  requests_.erase(it);
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
    if (it == requests_.end() || it->second.instance != from) continue;
    request_record& record = it->second;
    if (!record.started && (!delta.token_ids.empty() || delta.finished())) {
      record.started = true;
      ++instance->second.num_started;
      instance->second.num_queued_prompt_tokens -=
          static_cast<int64_t>(record.request.prompt_ids.size() + record.streamed.size());
    }
    record.streamed.insert(record.streamed.end(), delta.token_ids.begin(), delta.token_ids.end());
    if (delta.finished()) forget(it);
    out.deltas.push_back(std::move(delta));
    out.timelines.push_back(std::move(batch.timelines[i]));
  }
  for (request_failed& failure : batch.failures) {
    auto it = requests_.find(failure.request_id);
    if (it == requests_.end() || it->second.instance != from) continue;
    forget(it);
    out.failures.push_back(std::move(failure));
  }
  return out;
}

bool engine_router::on_refusal(engine_instance_id from, const request_failed& refusal) {
  auto it = requests_.find(refusal.request_id);
  if (it == requests_.end() || it->second.instance != from) return false;
  forget(it);
  return true;
}

std::optional<engine_instance_id> engine_router::instance_of(int64_t request_id) const {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return std::nullopt;
  return it->second.instance;
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
  std::vector<schedule_request> reruns;
  if (!instances_.erase(id)) return reruns;
  for (auto& [request_id, record] : requests_) {
    if (record.instance != id) continue;
    schedule_request again = record.request;
    again.resumed_output_ids = record.streamed;
    reruns.push_back(std::move(again));
    record.instance = -1;  // on no instance until routed again
    record.started = false;
  }
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

bool engine_router::drained(engine_instance_id id) const {
  auto it = instances_.find(id);
  return it != instances_.end() && it->second.state == engine_state::draining && it->second.num_requests == 0;
}

std::vector<std::pair<int64_t, engine_instance_id>> engine_router::routed_requests() const {
  std::vector<std::pair<int64_t, engine_instance_id>> out;
  for (const auto& [id, record] : requests_) {
    if (instances_.count(record.instance)) out.emplace_back(id, record.instance);
  }
  return out;
}

std::vector<engine_instance_info> engine_router::instances() const {
  std::vector<engine_instance_info> out;
  for (const auto& [id, instance] : instances_) {
    out.push_back(engine_instance_info{id, instance.node, instance.state, instance.num_requests,
                                       instance.num_queued_prompt_tokens, instance.load});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

}  // namespace troupe
