#include "stages/detokenizer_fanout.hpp"

#include "stages/detokenizer_shards.hpp"

namespace troupe {

detokenizer_fanout::detokenizer_fanout(size_t num_detokenizers, bool keep_ledger)
    : ledger_(keep_ledger ? std::make_unique<detokenizer_ledger>() : nullptr), resumptions_(num_detokenizers) {}

std::vector<detokenizer_fanout::part> detokenizer_fanout::route(token_batch batch, timestamp_ns now) {
  std::vector<token_batch> parts = split_for_detokenizers(std::move(batch), resumptions_.size());
  std::vector<part> out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) continue;
    // Noted before it is sent (or held): a loss after this point is resumed from the ledger.
    if (ledger_) ledger_->record(parts[i], now);
    if (!resumptions_[i].resuming) out.push_back(part{i, std::move(parts[i])});
  }
  return out;
}

detokenizer_fanout::resume_ticket detokenizer_fanout::begin_resume(size_t index) {
  resumption_state& state = resumptions_.at(index);
  // Without a ledger there is nothing to send the replacement, so nothing is held back for it.
  state.resuming = ledger_ != nullptr;
  resume_ticket ticket;
  ticket.detokenizer = index;
  ticket.generation = ++state.generation;
  if (ledger_) ticket.asked = ledger_->requests_of(index, resumptions_.size());
  return ticket;
}

std::optional<detokenizer_ledger::resumption> detokenizer_fanout::finish_resume(
    const resume_ticket& ticket, const std::unordered_map<int64_t, int32_t>& delivered) {
  resumption_state& state = resumptions_.at(ticket.detokenizer);
  if (state.generation != ticket.generation) return std::nullopt;  // replaced again meanwhile
  state.resuming = false;
  if (!ledger_) return std::nullopt;
  // Asked again now: requests that came while the frontend answered have reached no client yet.
  std::vector<std::pair<int64_t, int32_t>> counts;
  for (int64_t id : ledger_->requests_of(ticket.detokenizer, resumptions_.size())) {
    auto it = delivered.find(id);
    counts.emplace_back(id, it == delivered.end() ? 0 : it->second);
  }
  return ledger_->resume(counts);
}

}  // namespace troupe
