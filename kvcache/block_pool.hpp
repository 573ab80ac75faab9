#pragma once
// A fixed pool of KV blocks: reference counts, an intrusive LRU free list and the prefix cache.
//
// A block with ref_count 0 sits in the free list. If it once held a full block of tokens it keeps
// its hash and stays findable by prefix lookups until it is taken for new use (evicted): freeing
// is cheap and a later request with the same prefix gets the block back for free. Blocks taken
// for new use come from the head (least recently freed), freed blocks go to the tail.

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace troupe {

using block_hash = uint64_t;

class block_pool {
 public:
  block_pool(int num_blocks, int block_size, bool enable_prefix_caching);

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int block_size() const { return block_size_; }
  bool prefix_caching() const { return enable_prefix_caching_; }
  // Blocks nobody references (cached or not): what new allocations can take.
  int num_free_blocks() const { return num_free_; }
  int num_cached_blocks() const { return static_cast<int>(cached_.size()); }

  // Takes `count` unreferenced blocks from the LRU head (evicting their cached contents); each
  // comes back with ref_count 1. Throws std::runtime_error when fewer are free (nothing taken).
  std::vector<int32_t> take(int count);
  // A new reference to `block_id` (a prefix-cache hit); a free block leaves the free list.
  void acquire(int32_t block_id);
  // Drops one reference; at zero the block goes to the free-list tail, keeping its cached hash.
  void release(int32_t block_id);

  // The cached block holding exactly `tokens` after the chain `parent`, or -1.
  // `hash` must be hash_block(parent, tokens).
  int32_t find_cached(block_hash parent, block_hash hash, std::span<const int32_t> tokens) const;
  // Registers a full, computed block under its chained hash. A block whose hash is already owned
  // by another block stays uncached (the first copy wins).
  void cache_full_block(int32_t block_id, block_hash parent, block_hash hash, std::span<const int32_t> tokens);

  // Forgets every cached block's hash (the blocks stay where they are, referenced or free): for
  // when the KV behind them can no longer be trusted (a step failed part way, a pipeline stage
  // that held their layers' KV restarted). Returns how many were forgotten.
  int forget_cached();

  int ref_count(int32_t block_id) const { return blocks_.at(block_id).ref_count; }
  bool is_cached(int32_t block_id) const { return blocks_.at(block_id).cached; }

  // Chains a block's tokens to the hash of every block before it (FNV-1a over 64-bit words,
  // finished with a mixer); the root's parent is root_hash.
  static constexpr block_hash root_hash = 0x9e3779b97f4a7c15ull;
  static block_hash hash_block(block_hash parent, std::span<const int32_t> tokens);

 private:
  struct block {
    int32_t ref_count = 0;
    bool cached = false;
    block_hash hash = 0;
    block_hash parent = 0;
    std::vector<int32_t> tokens;  // [block_size] the tokens a cached block holds, to confirm hits
    int32_t prev_free = -1;       // intrusive doubly linked free list (-1: none)
    int32_t next_free = -1;
    bool in_free_list = false;
  };

  void push_free_tail(int32_t block_id);
  void unlink_free(int32_t block_id);
  void evict(int32_t block_id);

  int block_size_;
  bool enable_prefix_caching_;
  std::vector<block> blocks_;
  int32_t free_head_ = -1;
  int32_t free_tail_ = -1;
  int num_free_ = 0;
  std::unordered_map<block_hash, int32_t> cached_;  // hash -> block id
};

}  // namespace troupe
