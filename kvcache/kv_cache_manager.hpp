#pragma once
// Gives sequences the KV slots they need and takes them back. Every check (`can_*`) is separate
// from its change, and a change either happens whole or throws before touching anything.

#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/block_pool.hpp"
#include "kvcache/block_table.hpp"

namespace troupe {

class kv_cache_manager {
 public:
  kv_cache_manager(int num_blocks, int block_size, bool enable_prefix_caching);

  int block_size() const { return pool_.block_size(); }
  int num_blocks() const { return pool_.num_blocks(); }
  int num_free_blocks() const { return pool_.num_free_blocks(); }
  const block_pool& pool() const { return pool_; }

  // Blocks needed to hold `num_tokens` tokens.
  int blocks_for(int num_tokens) const { return (num_tokens + block_size() - 1) / block_size(); }

  // The longest run of cached full blocks that starts `token_ids`. It never covers the last
  // token: that token must be computed again so the model yields logits for it.
  prefix_hit find_cached_prefix(std::span<const int32_t> token_ids) const;
  // The same, with `block_hashes` as a memo of the chained hashes of token_ids' leading full
  // blocks: the lookup hashes only blocks the memo lacks and appends them. A waiting request that
  // cannot be admitted is looked up every step; its prompt is hashed once. The memo stays valid
  // while token_ids only grow (a full block's tokens never change).
  prefix_hit find_cached_prefix(std::span<const int32_t> token_ids, std::vector<block_hash>& block_hashes) const;

  // Blocks hashed by prefix lookups so far (the cost the memo saves; for tests and benchmarks).
  uint64_t num_blocks_hashed() const { return num_blocks_hashed_; }

  // Admission of a sequence that holds no blocks yet: room for `num_tokens` slots in all,
  // of which `hit` already provides the first hit.num_tokens.
  bool can_allocate(const prefix_hit& hit, int num_tokens) const;
  void allocate(block_table& table, const prefix_hit& hit, int num_tokens);

  // Growth of a running sequence's table to cover `num_tokens` slots in all.
  bool can_append(const block_table& table, int num_tokens) const;
  void append(block_table& table, int num_tokens);

  // Registers the table's full blocks whose tokens are all computed (the first
  // `num_computed_tokens` of `token_ids`) in the prefix cache.
  void cache_computed_blocks(block_table& table, std::span<const int32_t> token_ids, int num_computed_tokens);

  // Gives back the table's blocks whose tokens all lie before token `first_needed` (no query to
  // come attends to them: they left every layer's sliding window), at most the first
  // `max_blocks` of the table; their places become block_table::released. Blocks registered in
  // the prefix cache stay there (their K/V is still right for their prefix) until evicted.
  // Returns how many it gave back.
  int release_before(block_table& table, int first_needed, int max_blocks);

  // Drops the table's references, last block first so a sequence's tail is evicted before its
  // (more shareable) head, and empties the table.
  void free(block_table& table);

  // No prefix hit from here on reuses a block cached before (block_pool::forget_cached).
  int forget_cached_prefixes() { return pool_.forget_cached(); }

 private:
  block_pool pool_;
  mutable uint64_t num_blocks_hashed_ = 0;  // a statistic: lookups stay logically const
};

}  // namespace troupe
