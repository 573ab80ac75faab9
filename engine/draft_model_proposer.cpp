#include "engine/draft_model_proposer.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

#include "backends/backend_selection.hpp"
#include "backends/cpu/argmax.hpp"
#include "backends/cpu/cpu_model.hpp"
#include "model/loader/model_loader.hpp"

namespace troupe {

namespace {

std::string vocab_mismatch(const std::string& source, int vocab, int target_vocab_size) {
  return fmt::format(
      "draft model {} has vocab_size {}, the target model {}: a draft must share the target's vocabulary", source,
      vocab, target_vocab_size);
}

model& checked_draft(const std::shared_ptr<served_model>& draft, int target_vocab_size) {
  if (!draft || !draft->backend_model) throw std::runtime_error("draft_model_proposer: no draft model given");
  const int vocab = draft->backend_model->config().vocab_size;
  if (vocab != target_vocab_size) {
    throw std::runtime_error(vocab_mismatch(draft->loaded.source.string(), vocab, target_vocab_size));
  }
  return *draft->backend_model;
}

}  // namespace

std::shared_ptr<served_model> load_draft_model(const model_spec& spec, int target_vocab_size) {
  spec.validate();
  auto served = std::make_shared<served_model>();
  // A config.json alone is a dummy model's shape (random weights), as the target's tokenizer
  // lookup reads it: a draft needs no tokenizer, so that is all a random draft takes.
  load_format format = spec.format;
  const std::filesystem::path path = spec.path;
  if (format == load_format::auto_detect && path.extension() == ".json" && std::filesystem::is_regular_file(path)) {
    format = load_format::dummy;
  }
  served->loaded = load_model(load_options{path, format, dtype::f32, 0, false});
  const model_config& config = served->loaded.config;
  if (config.vocab_size != target_vocab_size) {
    throw std::runtime_error(vocab_mismatch(served->loaded.source.string(), config.vocab_size, target_vocab_size));
  }
  const device_choice device = choose_device(spec.device);
  served->device_note = device.fallback_reason;
  served->max_model_len = config.max_position_embeddings > 0 ? config.max_position_embeddings : 4096;
  if (spec.max_model_len > 0) served->max_model_len = std::min(served->max_model_len, spec.max_model_len);
  kv_pool_request kv;
  kv.block_size = spec.block_size;
  kv.num_blocks = spec.num_kv_blocks;
  if (kv.num_blocks == 0) {
    // Never more than every sequence at full length can use.
    const int64_t per_sequence = (served->max_model_len + spec.block_size - 1) / spec.block_size;
    const int64_t useful = std::min<int64_t>(int64_t(spec.max_num_seqs) * per_sequence, 1 << 30);
    kv.num_blocks = static_cast<int>(std::min<int64_t>(
        cpu_kv_blocks_for_budget(config, static_cast<size_t>(spec.kv_memory_mb) << 20, spec.block_size,
                                 resolve_kv_cache_dtype(spec.backend, device.kind, served->loaded.weights)),
        useful));
    if (kv.num_blocks <= 0) {
      throw std::runtime_error(fmt::format("draft model {}: a KV budget of {} MiB holds no block of {} tokens",
                                           spec.path, spec.kv_memory_mb, spec.block_size));
    }
  }
  served->backend_model = make_backend_model(config, served->loaded.weights, device.kind, kv, spec.backend);
  // As for the target (served_model.cpp): the loader's copies the backend repacked are freed.
  served->loaded.weights.release_copies(cpu_weights_not_read(*served->backend_model));
  served->eos_token_ids.assign(config.eos_token_ids.begin(), config.eos_token_ids.end());
  return served;
}

draft_model_proposer::draft_model_proposer(model& draft, int target_vocab_size, int max_model_len)
    : draft_(draft),
      vocab_size_(draft.config().vocab_size),
      block_size_(draft.kv_shape().block_size),
      num_blocks_(draft.kv_shape().num_blocks),
      max_model_len_(max_model_len > 0 ? max_model_len : draft.config().max_position_embeddings) {
  if (vocab_size_ != target_vocab_size) {
    throw std::runtime_error(
        fmt::format("draft model has vocab_size {}, the target model {}: a draft must share the target's vocabulary",
                    vocab_size_, target_vocab_size));
  }
  if (block_size_ <= 0 || num_blocks_ <= 0) {
    throw std::runtime_error(
        fmt::format("draft model: its KV pool of {} blocks of {} tokens holds nothing", num_blocks_, block_size_));
  }
  // Without a stated context, the pool is the limit.
  if (max_model_len_ <= 0) max_model_len_ = num_blocks_ * block_size_;
  free_blocks_.reserve(num_blocks_);
  // Popped from the back: the low ids go first.
  for (int32_t b = num_blocks_ - 1; b >= 0; --b) free_blocks_.push_back(b);
}

draft_model_proposer::draft_model_proposer(std::shared_ptr<served_model> draft, int target_vocab_size)
    : draft_model_proposer(checked_draft(draft, target_vocab_size), target_vocab_size, draft->max_model_len) {
  source_ = draft->loaded.source.string();
  owned_ = std::move(draft);
}

std::string draft_model_proposer::describe() const {
  return fmt::format("draft model {} (vocab {}) on {}: {} KV blocks of {} tokens, context {}",
                     source_.empty() ? std::string("(in memory)") : source_, vocab_size_, draft_.backend_name(),
                     num_blocks_, block_size_, max_model_len_);
}

void draft_model_proposer::forget(int64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  free_blocks_.insert(free_blocks_.end(), it->second.block_table.begin(), it->second.block_table.end());
  requests_.erase(it);
}

bool draft_model_proposer::prepare(const draft_request& r, int num_drafts, request_state& state, int32_t& first_new) {
  // What the pool holds of this history; the last history token is always fed again, since its
  // logits are the first draft's.
  const size_t history = r.history.size();
  const size_t limit = std::min(state.fed.size(), history - 1);
  // Usually all of it matches: one memcmp settles that; only a rollback looks for where.
  size_t common = limit;
  if (limit > 0 && std::memcmp(state.fed.data(), r.history.data(), limit * sizeof(int32_t)) != 0) {
    common = static_cast<size_t>(std::mismatch(state.fed.begin(), state.fed.begin() + limit, r.history.begin()).first -
                                 state.fed.begin());
  }
  state.fed.resize(common);
  // Positions up to history - 1 + (num_drafts - 1) get K/V: the last draft is never fed.
  const size_t tokens = history + static_cast<size_t>(num_drafts) - 1;
  const size_t blocks = (tokens + block_size_ - 1) / block_size_;
  if (blocks > state.block_table.size()) {
    const size_t more = blocks - state.block_table.size();
    if (more > free_blocks_.size()) return false;
    for (size_t i = 0; i < more; ++i) {
      state.block_table.push_back(free_blocks_.back());
      free_blocks_.pop_back();
    }
  }
  first_new = static_cast<int32_t>(common);
  state.fed.insert(state.fed.end(), r.history.begin() + common, r.history.end());
  return true;
}

void draft_model_proposer::propose(std::span<const draft_request> requests, std::vector<std::vector<int32_t>>& drafts) {
  drafts.resize(requests.size());
  for (std::vector<int32_t>& d : drafts) d.clear();
  const uint64_t call = ++num_calls_;
  active_.clear();
  int max_drafts = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const draft_request& r = requests[i];
    if (r.max_drafts <= 0 || r.history.empty()) continue;
    // The last draft's input sits at position history + num_drafts - 2: inside the context.
    const int64_t room = int64_t(max_model_len_) - int64_t(r.history.size()) + 1;
    const int num_drafts = static_cast<int>(std::min<int64_t>(r.max_drafts, room));
    if (num_drafts <= 0) continue;
    auto [it, inserted] = requests_.try_emplace(r.request_id);
    request_state& state = it->second;
    if (!inserted && state.last_call == call) continue;  // listed twice: drafts once
    int32_t first_new = 0;
    if (!prepare(r, num_drafts, state, first_new)) {
      if (state.block_table.empty()) requests_.erase(it);  // holds nothing: keep no entry
      continue;
    }
    state.last_call = call;
    active_.push_back({i, &state, first_new, num_drafts});
    max_drafts = std::max(max_drafts, num_drafts);
  }
  try {
    for (int position = 0; position < max_drafts; ++position) {
      build_batch(requests, drafts, position);
      run_greedy();
      size_t row = 0;
      for (const active_request& a : active_) {
        if (a.num_drafts > position) drafts[a.index].push_back(tokens_[row++]);
      }
    }
  } catch (...) {
    // A failed forward leaves the pool unknown for these requests: they start afresh.
    for (const active_request& a : active_) forget(requests[a.index].request_id);
    for (std::vector<int32_t>& d : drafts) d.clear();
    throw;
  }
}

void draft_model_proposer::build_batch(std::span<const draft_request> requests,
                                       const std::vector<std::vector<int32_t>>& drafts, int position) {
  forward_batch& b = batch_;
  for (auto* v : {&b.token_ids, &b.positions, &b.query_start, &b.context_lengths, &b.block_table_start, &b.block_tables,
                  &b.logits_rows}) {
    v->clear();
  }
  b.slot_mapping.clear();
  b.query_start.push_back(0);
  b.block_table_start.push_back(0);
  for (const active_request& a : active_) {
    if (a.num_drafts <= position) continue;
    request_state& s = *a.state;
    int32_t first = a.first_new;
    if (position > 0) {
      // The previous forward's draft is this one's input.
      first = static_cast<int32_t>(s.fed.size());
      s.fed.push_back(drafts[a.index].back());
    }
    const int32_t context = static_cast<int32_t>(s.fed.size());
    for (int32_t p = first; p < context; ++p) {
      b.token_ids.push_back(s.fed[p]);
      b.positions.push_back(p);
      b.slot_mapping.push_back(int64_t(s.block_table[p / block_size_]) * block_size_ + p % block_size_);
    }
    b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
    b.context_lengths.push_back(context);
    const int32_t blocks = (context + block_size_ - 1) / block_size_;
    b.block_tables.insert(b.block_tables.end(), s.block_table.begin(), s.block_table.begin() + blocks);
    b.block_table_start.push_back(static_cast<int32_t>(b.block_tables.size()));
    b.logits_rows.push_back(b.query_start.back() - 1);
  }
}

void draft_model_proposer::run_greedy() {
  const int num_logits = batch_.num_logits();
  tokens_.resize(num_logits);
  if (draft_.can_sample_on_device()) {
    // Only one id per row crosses to the host.
    rows_.resize(num_logits);  // default rows are greedy
    draft_.forward_sample(batch_, rows_, tokens_.data());
    return;
  }
  logits_.resize(static_cast<size_t>(num_logits) * vocab_size_);
  draft_.forward(batch_, logits_.data());
  for (int i = 0; i < num_logits; ++i) {
    tokens_[i] = argmax(std::span<const float>(logits_.data() + static_cast<size_t>(i) * vocab_size_, vocab_size_));
  }
}

}  // namespace troupe
