#pragma once
// The KV blocks one sequence holds, in token order: token t lives in block_ids[t / block_size].

#include <cstdint>
#include <vector>

#include "kvcache/block_pool.hpp"

namespace troupe {

struct block_table {
  // A block given back while the sequence lives (it left a sliding window; see
  // kv_cache_manager::release_before): its place is kept so token t stays in block_ids[t / block_size].
  static constexpr int32_t released = -1;

  std::vector<int32_t> block_ids;
  // Chained hashes of the leading full blocks already registered in (or found in) the prefix
  // cache: hashes[i] belongs to block_ids[i]. Kept so the chain is never hashed twice.
  std::vector<block_hash> hashes;

  int num_blocks() const { return static_cast<int>(block_ids.size()); }
  // Blocks the table still holds (num_blocks less the released ones).
  int num_held_blocks() const {
    int held = 0;
    for (int32_t id : block_ids) held += id != released ? 1 : 0;
    return held;
  }
  bool empty() const { return block_ids.empty(); }
};

// What a prefix-cache lookup found: the leading cached blocks of a token sequence.
struct prefix_hit {
  std::vector<int32_t> block_ids;
  std::vector<block_hash> hashes;
  int num_tokens = 0;  // block_ids.size() * block_size
};

}  // namespace troupe
