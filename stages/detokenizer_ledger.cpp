#include "stages/detokenizer_ledger.hpp"

#include "stages/detokenizer_shards.hpp"

namespace troupe {

void detokenizer_ledger::ended(int64_t request_id, entry& e, timestamp_ns now) {
  if (e.ended) return;
  e.ended = true;
  ended_order_.emplace_back(now, request_id);
}

void detokenizer_ledger::forget_old(timestamp_ns now) {
  while (!ended_order_.empty() &&
         (ended_order_.size() > max_ended_ || now - ended_order_.front().first > keep_ended_)) {
    entries_.erase(ended_order_.front().second);
    ended_order_.pop_front();
  }
}

void detokenizer_ledger::record(const token_batch& batch, timestamp_ns now) {
  for (size_t i = 0; i < batch.deltas.size(); ++i) {
    const token_delta& delta = batch.deltas[i];
    entry& e = entries_[delta.request_id];
    if (e.ended) continue;  // a late delta after the request's end: the detokenizer drops it too
    if (!e.seen_first_delta) {
      // The first delta carries what the detokenizer keeps for the whole request.
      e.seen_first_delta = true;
      e.stop = delta.stop;
      e.skip_special_tokens = delta.skip_special_tokens;
    }
    e.deltas.push_back(delta);
    e.timelines.push_back(i < batch.timelines.size() ? batch.timelines[i] : request_timeline{});
    if (delta.finished()) ended(delta.request_id, e, now);
  }
  for (const request_failed& failure : batch.failures) {
    entry& e = entries_[failure.request_id];
    if (e.ended) continue;
    e.failure = failure;
    ended(failure.request_id, e, now);
  }
  forget_old(now);
}

std::vector<int64_t> detokenizer_ledger::requests_of(size_t shard, size_t num_shards) const {
  std::vector<int64_t> ids;
  for (const auto& [id, e] : entries_) {
    if (detokenizer_of(id, num_shards) == shard) ids.push_back(id);
  }
  return ids;
}

detokenizer_ledger::resumption detokenizer_ledger::resume(
    const std::vector<std::pair<int64_t, int32_t>>& delivered) const {
  resumption out;
  for (const auto& [id, num_delivered] : delivered) {
    auto it = entries_.find(id);
    if (it == entries_.end() || num_delivered < 0) continue;  // unknown, or the client has its end
    const entry& e = it->second;
    // The tokens the client has are the first num_delivered of the deltas, in order: the lost
    // detokenizer passed each delta on whole (a stop string's cut only ever shortens the one it
    // holds back, which the client does not have yet).
    detokenizer_resume_msg prime{id, e.stop, e.skip_special_tokens, {}};
    size_t left = static_cast<size_t>(num_delivered);
    for (size_t i = 0; i < e.deltas.size(); ++i) {
      const token_delta& delta = e.deltas[i];
      if (left >= delta.token_ids.size() && !delta.finished() && left > 0) {
        prime.spelled_ids.insert(prime.spelled_ids.end(), delta.token_ids.begin(), delta.token_ids.end());
        left -= delta.token_ids.size();
        continue;
      }
      token_delta rest = delta;
      if (left > 0) {
        // Part of it reached the client: only the other part is spelled again.
        prime.spelled_ids.insert(prime.spelled_ids.end(), delta.token_ids.begin(),
                                 delta.token_ids.begin() + static_cast<std::ptrdiff_t>(left));
        rest.token_ids.erase(rest.token_ids.begin(), rest.token_ids.begin() + static_cast<std::ptrdiff_t>(left));
        if (rest.logprobs.size() > left) {
          rest.logprobs.erase(rest.logprobs.begin(), rest.logprobs.begin() + static_cast<std::ptrdiff_t>(left));
        } else {
          rest.logprobs.clear();
        }
        rest.prompt_logprobs.clear();
        left = 0;
      }
      // The prime carries the stop strings when the client has text; else the first delta does.
      if (num_delivered > 0) rest.stop.clear();
      out.replay.deltas.push_back(std::move(rest));
      out.replay.timelines.push_back(e.timelines[i]);
    }
    if (num_delivered > 0) out.primes.push_back(std::move(prime));
    if (e.failure) out.replay.failures.push_back(*e.failure);
  }
  return out;
}

}  // namespace troupe
