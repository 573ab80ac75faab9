#include "text/bpe_model.hpp"

#include <algorithm>
#include <cstdio>
#include <queue>
#include <stdexcept>

#include "text/byte_level.hpp"
#include "text/unicode/utf8.hpp"

namespace troupe {

bpe_model::bpe_model(const nlohmann::json& model) {
  const std::string type = model.value("type", "BPE");
  if (type != "BPE")
    throw std::runtime_error("tokenizer.json model type '" + type + "' is not supported (expected BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "continuing_subword_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      throw std::runtime_error(std::string("BPE model: a non-empty ") + key + " is not supported");
  }
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0.0)
    throw std::runtime_error("BPE model: dropout is a training feature and is not supported");

  const auto& vocab = model.at("vocab");
  if (!vocab.is_object()) throw std::runtime_error("BPE model: 'vocab' must be an object of token -> id");
  vocab_.reserve(vocab.size());
  std::int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto id = it.value().get<std::int32_t>();
    if (id < 0) throw std::runtime_error("BPE model: token '" + it.key() + "' has a negative id");
    vocab_.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<std::size_t>(max_id + 1), std::string());
  for (const auto& [token, id] : vocab_) id_to_token_[id] = token;

  if (model.contains("unk_token") && model["unk_token"].is_string())
    unk_id_ = token_to_id(model["unk_token"].get<std::string>());
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);
  ignore_merges_ =
      model.contains("ignore_merges") && model["ignore_merges"].is_boolean() && model["ignore_merges"].get<bool>();

  const auto& byte_chars = byte_level::byte_to_utf8();
  for (int b = 0; b < 256; ++b) {
    byte_level_ids_[b] = token_to_id(byte_chars[b]).value_or(-1);
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_fallback_ids_[b] = token_to_id(name).value_or(-1);
  }

  for (int c = 0; c < 128; ++c) ascii_ids_[c] = token_to_id(std::string(1, static_cast<char>(c))).value_or(-1);

  const auto& merges = model.at("merges");
  std::size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity *= 2;
  merge_table_.assign(capacity, merge_slot{});
  merge_mask_ = capacity - 1;
  std::int32_t rank = 0;
  for (const auto& entry : merges) {
    std::string left, right;
    if (entry.is_array() && entry.size() == 2) {
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    } else if (entry.is_string()) {
      const std::string text = entry.get<std::string>();
      const std::size_t space = text.find(' ', 1);
      if (space == std::string::npos) throw std::runtime_error("BPE model: merge '" + text + "' is not 'left right'");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {
      throw std::runtime_error("BPE model: merge " + entry.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const auto left_id = token_to_id(left), right_id = token_to_id(right), merged_id = token_to_id(left + right);
    // A merge whose parts or result are outside the vocabulary can never fire on vocabulary ids.
    if (left_id && right_id && merged_id) insert_merge(pair_key(*left_id, *right_id), merge{rank, *merged_id});
    ++rank;
  }
}

void bpe_model::insert_merge(std::uint64_t key, merge value) {
  for (std::uint64_t i = (key * 0x9E3779B97F4A7C15ull) >> 20 & merge_mask_;; i = (i + 1) & merge_mask_) {
    merge_slot& slot = merge_table_[i];
    // A pair listed twice keeps its last rank, as the reference implementations' maps do.
    if (slot.key == key || slot.key == ~std::uint64_t{0}) {
      slot = {key, value};
      return;
    }
  }
}

std::optional<std::int32_t> bpe_model::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* bpe_model::id_to_token(std::int32_t id) const {
  if (id < 0 || id >= id_limit()) return nullptr;
  const std::string& token = id_to_token_[id];
  // Holes in the id range are empty strings; a real token is never empty.
  return token.empty() ? nullptr : &token;
}

void bpe_model::append_unknown(std::string_view text, std::vector<std::int32_t>& ids) const {
  if (byte_fallback_) {
    const bool all_bytes = std::all_of(text.begin(), text.end(),
                                       [&](char c) { return byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0; });
    if (all_bytes) {
      for (char c : text) ids.push_back(byte_fallback_ids_[static_cast<unsigned char>(c)]);
      return;
    }
  }
  if (unk_id_) ids.push_back(*unk_id_);
}

void bpe_model::encode(std::string_view piece, bool byte_level, std::vector<std::int32_t>& ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    // Llama 3: a piece that is a whole vocabulary entry is taken as is, whatever the merges say.
    std::optional<std::int32_t> whole;
    if (byte_level) {
      std::string spelled;
      spelled.reserve(piece.size() * 2);
      for (char c : piece) spelled += byte_level::byte_to_utf8()[static_cast<unsigned char>(c)];
      whole = token_to_id(spelled);
    } else {
      whole = token_to_id(piece);
    }
    if (whole) {
      ids.push_back(*whole);
      return;
    }
  }
  const bool cacheable = piece.size() <= max_cached_piece_bytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (const auto it = cache_.find(piece); it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t first = ids.size();
  merge_symbols(piece, byte_level, ids);
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= max_cache_entries) cache_.clear();
    cache_.emplace(std::string(piece),
                   std::vector<std::int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end()));
  }
}

void bpe_model::merge_symbols(std::string_view piece, bool byte_level, std::vector<std::int32_t>& ids) const {
  struct symbol {
    std::int32_t id;           // -1: a character outside the vocabulary (never merges)
    std::uint32_t begin, end;  // bytes of the piece it covers
    std::int32_t prev, next;   // neighbours in the linked list; -1 at the ends
  };
  std::vector<symbol> symbols;
  symbols.reserve(piece.size());
  if (byte_level) {
    for (std::size_t i = 0; i < piece.size(); ++i)
      symbols.push_back({byte_level_ids_[static_cast<unsigned char>(piece[i])], static_cast<std::uint32_t>(i),
                         static_cast<std::uint32_t>(i + 1), 0, 0});
  } else {
    for (std::size_t pos = 0; pos < piece.size();) {
      const std::size_t begin = pos;
      const auto lead = static_cast<unsigned char>(piece[pos]);
      pos += utf8::sequence_length(lead);
      const std::int32_t id =
          lead < 0x80 ? ascii_ids_[lead] : token_to_id(piece.substr(begin, pos - begin)).value_or(-1);
      symbols.push_back({id, static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(pos), 0, 0});
    }
  }
  const auto n = static_cast<std::int32_t>(symbols.size());
  for (std::int32_t i = 0; i < n; ++i) {
    symbols[i].prev = i - 1;
    symbols[i].next = i + 1 < n ? i + 1 : -1;
  }

  struct candidate {
    std::int32_t rank, left, right;
    std::int32_t left_id, right_id;  // the ids when queued; a stale entry no longer matches
    std::int32_t merged_id;
    bool operator>(const candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<candidate> storage;
  storage.reserve(symbols.size());
  std::priority_queue<candidate, std::vector<candidate>, std::greater<>> queue(std::greater<>{}, std::move(storage));
  auto consider = [&](std::int32_t left) {
    if (left < 0) return;
    const std::int32_t right = symbols[left].next;
    if (right < 0 || symbols[left].id < 0 || symbols[right].id < 0) return;
    const merge* m = find_merge(pair_key(symbols[left].id, symbols[right].id));
    if (m == nullptr) return;
    queue.push({m->rank, left, right, symbols[left].id, symbols[right].id, m->id});
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!queue.empty()) {
    const candidate top = queue.top();
    queue.pop();
    symbol& left = symbols[top.left];
    if (left.id != top.left_id || left.next != top.right || symbols[top.right].id != top.right_id) continue;
    symbol& right = symbols[top.right];
    left.id = top.merged_id;
    left.end = right.end;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    right.id = -2;  // dead
    right.next = -1;
    consider(left.prev);
    consider(top.left);
  }

  for (std::int32_t i = 0; i >= 0 && i < n; i = symbols[i].next) {
    const symbol& s = symbols[i];
    if (s.id >= 0)
      ids.push_back(s.id);
    else
      append_unknown(piece.substr(s.begin, s.end - s.begin), ids);
  }
}

}  // namespace troupe
