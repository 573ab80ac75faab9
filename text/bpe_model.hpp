#pragma once
// The BPE model of tokenizer.json ("model": {"type": "BPE"}): vocabulary, ranked merges, byte
// fallback (SentencePiece style "<0x41>" tokens), ignore_merges (Llama 3) and fuse_unk.
//
// Merging works on token ids with a priority queue over adjacent pairs (rank, then position), so a
// long piece costs O(n log n); short pieces are remembered in a cache.

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe {

// Hash for unordered_map<std::string, ...> that also accepts string_view keys without a copy.
struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using token_map = std::unordered_map<std::string, std::int32_t, string_hash, std::equal_to<>>;

class bpe_model {
 public:
  explicit bpe_model(const nlohmann::json& model);

  // Appends the ids of one pre-token. byte_level: the piece is raw UTF-8 whose bytes the
  // vocabulary spells in GPT-2's byte alphabet.
  void encode(std::string_view piece, bool byte_level, std::vector<std::int32_t>& ids) const;

  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  // nullptr when the id is not in the model's vocabulary (added tokens live elsewhere).
  const std::string* id_to_token(std::int32_t id) const;
  // One past the largest id of the model's vocabulary.
  std::int32_t id_limit() const { return static_cast<std::int32_t>(id_to_token_.size()); }

  std::optional<std::int32_t> unk_id() const { return unk_id_; }
  bool fuse_unk() const { return fuse_unk_; }

 private:
  struct merge {
    std::int32_t rank;
    std::int32_t id;  // the merged token
  };
  static std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }

  void merge_symbols(std::string_view piece, bool byte_level, std::vector<std::int32_t>& ids) const;
  void append_unknown(std::string_view text, std::vector<std::int32_t>& ids) const;

  token_map vocab_;
  std::vector<std::string> id_to_token_;
  // Open addressing keyed by pair_key: the merge loop's hottest lookup.
  struct merge_slot {
    std::uint64_t key = ~std::uint64_t{0};  // empty
    merge value{};
  };
  std::vector<merge_slot> merge_table_;
  std::uint64_t merge_mask_ = 0;
  void insert_merge(std::uint64_t key, merge value);
  const merge* find_merge(std::uint64_t key) const {
    for (std::uint64_t i = (key * 0x9E3779B97F4A7C15ull) >> 20 & merge_mask_;; i = (i + 1) & merge_mask_) {
      const merge_slot& slot = merge_table_[i];
      if (slot.key == key) return &slot.value;
      if (slot.key == ~std::uint64_t{0}) return nullptr;
    }
  }
  std::array<std::int32_t, 128> ascii_ids_{};          // ASCII character -> id (-1: not in vocabulary)
  std::array<std::int32_t, 256> byte_level_ids_{};     // byte -> id of its byte-level character, or -1
  std::array<std::int32_t, 256> byte_fallback_ids_{};  // byte -> id of "<0xHH>", or -1
  std::optional<std::int32_t> unk_id_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  static constexpr std::size_t max_cached_piece_bytes = 256;
  static constexpr std::size_t max_cache_entries = 1 << 16;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>, string_hash, std::equal_to<>> cache_;
};

}  // namespace troupe
