#include "kvcache/kv_cache_manager.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe {

kv_cache_manager::kv_cache_manager(int num_blocks, int block_size, bool enable_prefix_caching)
    : pool_(num_blocks, block_size, enable_prefix_caching) {}

prefix_hit kv_cache_manager::find_cached_prefix(std::span<const int32_t> token_ids) const {
  std::vector<block_hash> block_hashes;
  return find_cached_prefix(token_ids, block_hashes);
}

prefix_hit kv_cache_manager::find_cached_prefix(std::span<const int32_t> token_ids,
                                                std::vector<block_hash>& block_hashes) const {
  prefix_hit hit;
  if (!pool_.prefix_caching() || token_ids.empty()) return hit;
  const int bs = block_size();
  const int max_blocks = (static_cast<int>(token_ids.size()) - 1) / bs;
  block_hash parent = block_pool::root_hash;
  for (int i = 0; i < max_blocks; ++i) {
    auto tokens = token_ids.subspan(static_cast<size_t>(i) * bs, static_cast<size_t>(bs));
    if (i == static_cast<int>(block_hashes.size())) {
      block_hashes.push_back(block_pool::hash_block(parent, tokens));
      ++num_blocks_hashed_;
    }
    const block_hash hash = block_hashes[static_cast<size_t>(i)];
    int32_t id = pool_.find_cached(parent, hash, tokens);
    if (id < 0) break;
    hit.block_ids.push_back(id);
    hit.hashes.push_back(hash);
    parent = hash;
  }
  hit.num_tokens = static_cast<int>(hit.block_ids.size()) * bs;
  return hit;
}

bool kv_cache_manager::can_allocate(const prefix_hit& hit, int num_tokens) const {
  const int num_new = blocks_for(num_tokens) - static_cast<int>(hit.block_ids.size());
  // A hit block nobody references is counted as free; taking it leaves one fewer for the rest.
  int free_hits = 0;
  for (int32_t id : hit.block_ids) free_hits += pool_.ref_count(id) == 0 ? 1 : 0;
  return std::max(num_new, 0) + free_hits <= num_free_blocks();
}

void kv_cache_manager::allocate(block_table& table, const prefix_hit& hit, int num_tokens) {
  if (!table.empty()) {
    throw std::runtime_error("kv_cache_manager: allocate needs an empty block table, this one holds " +
                             std::to_string(table.num_blocks()) + " blocks (use append)");
  }
  if (hit.num_tokens > num_tokens) {
    throw std::runtime_error("kv_cache_manager: prefix hit of " + std::to_string(hit.num_tokens) +
                             " tokens exceeds the " + std::to_string(num_tokens) + " tokens asked for");
  }
  for (int32_t id : hit.block_ids) {
    if (!pool_.is_cached(id)) {
      throw std::runtime_error("kv_cache_manager: prefix hit is stale, block " + std::to_string(id) +
                               " was evicted since the lookup");
    }
  }
  if (!can_allocate(hit, num_tokens)) {
    throw std::runtime_error("kv_cache_manager: no room for " + std::to_string(num_tokens) + " tokens (" +
                             std::to_string(num_free_blocks()) + " free blocks)");
  }
  for (int32_t id : hit.block_ids) pool_.acquire(id);
  const int num_new = blocks_for(num_tokens) - static_cast<int>(hit.block_ids.size());
  std::vector<int32_t> fresh = pool_.take(num_new);
  table.block_ids = hit.block_ids;
  table.block_ids.insert(table.block_ids.end(), fresh.begin(), fresh.end());
  table.hashes = hit.hashes;
}

bool kv_cache_manager::can_append(const block_table& table, int num_tokens) const {
  return blocks_for(num_tokens) - table.num_blocks() <= num_free_blocks();
}

void kv_cache_manager::append(block_table& table, int num_tokens) {
  const int num_new = blocks_for(num_tokens) - table.num_blocks();
  if (num_new <= 0) return;
  if (num_new > num_free_blocks()) {
    throw std::runtime_error("kv_cache_manager: no room to grow to " + std::to_string(num_tokens) +
                             " tokens: " + std::to_string(num_new) + " blocks needed, " +
                             std::to_string(num_free_blocks()) + " free");
  }
  std::vector<int32_t> fresh = pool_.take(num_new);
  table.block_ids.insert(table.block_ids.end(), fresh.begin(), fresh.end());
}

void kv_cache_manager::cache_computed_blocks(block_table& table, std::span<const int32_t> token_ids,
                                             int num_computed_tokens) {
  if (!pool_.prefix_caching()) return;
  const int bs = block_size();
  const int computed = std::min(num_computed_tokens, static_cast<int>(token_ids.size()));
  const int num_full = std::min(computed / bs, table.num_blocks());
  for (int i = static_cast<int>(table.hashes.size()); i < num_full; ++i) {
    auto tokens = token_ids.subspan(static_cast<size_t>(i) * bs, static_cast<size_t>(bs));
    block_hash parent = i == 0 ? block_pool::root_hash : table.hashes[i - 1];
    block_hash hash = block_pool::hash_block(parent, tokens);
    // A released block is no longer this table's to register; the chain still runs through it.
    if (table.block_ids[i] != block_table::released) pool_.cache_full_block(table.block_ids[i], parent, hash, tokens);
    table.hashes.push_back(hash);
  }
}

int kv_cache_manager::release_before(block_table& table, int first_needed, int max_blocks) {
  const int end = std::min({first_needed / block_size(), max_blocks, table.num_blocks()});
  int released = 0;
  for (int i = 0; i < end; ++i) {
    if (table.block_ids[i] == block_table::released) continue;
    pool_.release(table.block_ids[i]);
    table.block_ids[i] = block_table::released;
    ++released;
  }
  return released;
}

void kv_cache_manager::free(block_table& table) {
  for (auto it = table.block_ids.rbegin(); it != table.block_ids.rend(); ++it) {
    if (*it != block_table::released) pool_.release(*it);
  }
  table.block_ids.clear();
  table.hashes.clear();
}

}  // namespace troupe
