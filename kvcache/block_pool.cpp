#include "kvcache/block_pool.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe {

block_pool::block_pool(int num_blocks, int block_size, bool enable_prefix_caching)
    : block_size_(block_size), enable_prefix_caching_(enable_prefix_caching) {
  if (num_blocks <= 0) {
    throw std::runtime_error("block_pool: num_blocks must be positive, got " + std::to_string(num_blocks));
  }
  if (block_size <= 0) {
    throw std::runtime_error("block_pool: block_size must be positive, got " + std::to_string(block_size));
  }
  blocks_.resize(static_cast<size_t>(num_blocks));
  for (int32_t id = 0; id < num_blocks; ++id) push_free_tail(id);
}

std::vector<int32_t> block_pool::take(int count) {
  if (count < 0 || count > num_free_) {
    throw std::runtime_error("block_pool: asked for " + std::to_string(count) + " blocks, " +
                             std::to_string(num_free_) + " free");
  }
  std::vector<int32_t> taken;
  taken.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    int32_t id = free_head_;
    unlink_free(id);
    evict(id);
    blocks_[id].ref_count = 1;
    taken.push_back(id);
  }
  return taken;
}

void block_pool::acquire(int32_t block_id) {
  block& b = blocks_.at(block_id);
  if (b.ref_count == 0) unlink_free(block_id);
  ++b.ref_count;
}

void block_pool::release(int32_t block_id) {
  block& b = blocks_.at(block_id);
  if (b.ref_count <= 0) {
    throw std::runtime_error("block_pool: released block " + std::to_string(block_id) + " which has no references");
  }
  if (--b.ref_count == 0) push_free_tail(block_id);
}

int32_t block_pool::find_cached(block_hash parent, block_hash hash, std::span<const int32_t> tokens) const {
  if (!enable_prefix_caching_) return -1;
  auto it = cached_.find(hash);
  if (it == cached_.end()) return -1;
  const block& b = blocks_[it->second];
  // The hash only points the way: equal parent chain and equal tokens make it a hit.
  if (b.parent != parent || !std::equal(tokens.begin(), tokens.end(), b.tokens.begin(), b.tokens.end())) {
    return -1;
  }
  return it->second;
}

void block_pool::cache_full_block(int32_t block_id, block_hash parent, block_hash hash,
                                  std::span<const int32_t> tokens) {
  if (!enable_prefix_caching_) return;
  if (static_cast<int>(tokens.size()) != block_size_) {
    throw std::runtime_error("block_pool: only full blocks are cached; block " + std::to_string(block_id) + " has " +
                             std::to_string(tokens.size()) + " tokens, expected " + std::to_string(block_size_));
  }
  block& b = blocks_.at(block_id);
  if (b.cached) return;
  if (cached_.count(hash) != 0) return;
  b.cached = true;
  b.hash = hash;
  b.parent = parent;
  b.tokens.assign(tokens.begin(), tokens.end());
  cached_.emplace(hash, block_id);
}

block_hash block_pool::hash_block(block_hash parent, std::span<const int32_t> tokens) {
  constexpr uint64_t prime = 0x100000001b3ull;
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix_in = [&](uint64_t word) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (word >> (8 * byte)) & 0xff;
      h *= prime;
    }
  };
  mix_in(parent);
  for (int32_t t : tokens) mix_in(static_cast<uint32_t>(t));
  // splitmix64 finalizer: spreads FNV's weak high bits.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

void block_pool::push_free_tail(int32_t block_id) {
  block& b = blocks_[block_id];
  b.prev_free = free_tail_;
  b.next_free = -1;
  b.in_free_list = true;
  if (free_tail_ >= 0) {
    blocks_[free_tail_].next_free = block_id;
  } else {
    free_head_ = block_id;
  }
  free_tail_ = block_id;
  ++num_free_;
}

void block_pool::unlink_free(int32_t block_id) {
  block& b = blocks_[block_id];
  if (!b.in_free_list) {
    throw std::runtime_error("block_pool: block " + std::to_string(block_id) + " is not free");
  }
  if (b.prev_free >= 0) {
    blocks_[b.prev_free].next_free = b.next_free;
  } else {
    free_head_ = b.next_free;
  }
  if (b.next_free >= 0) {
    blocks_[b.next_free].prev_free = b.prev_free;
  } else {
    free_tail_ = b.prev_free;
  }
  b.prev_free = b.next_free = -1;
  b.in_free_list = false;
  --num_free_;
}

int block_pool::forget_cached() {
  const int forgotten = static_cast<int>(cached_.size());
  for (const auto& [hash, block_id] : std::unordered_map<block_hash, int32_t>(cached_)) evict(block_id);
  return forgotten;
}

void block_pool::evict(int32_t block_id) {
  block& b = blocks_[block_id];
  if (!b.cached) return;
  cached_.erase(b.hash);
  b.cached = false;
  b.tokens.clear();
}

}  // namespace troupe
