#include "kvtransfer/kv_buffer_pool.hpp"

#include <algorithm>

namespace troupe {

namespace {

using buffer_list = std::vector<std::vector<std::byte>>;

// Takes `it` out of `kept` (unordered: the last one fills its place).
std::vector<std::byte> remove(buffer_list& kept, buffer_list::iterator it) {
  std::swap(*it, kept.back());
  std::vector<std::byte> removed = std::move(kept.back());
  kept.pop_back();
  return removed;
}

// The kept buffer of least capacity (end() if none).
buffer_list::iterator smallest(buffer_list& kept) {
  return std::min_element(kept.begin(), kept.end(),
                          [](const auto& a, const auto& b) { return a.capacity() < b.capacity(); });
}

}  // namespace

kv_buffer_pool::kv_buffer_pool(size_t max_buffers, size_t max_bytes)
    : max_buffers_(max_buffers), max_bytes_(max_bytes), last_take_(std::chrono::steady_clock::now()) {
  kept_.reserve(max_buffers_);
}

std::vector<std::byte> kv_buffer_pool::take(size_t bytes) {
  if (bytes == 0) return {};
  std::vector<std::byte> found;
  {
    std::lock_guard lock(mutex_);
    last_take_ = std::chrono::steady_clock::now();
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->capacity() >= bytes && (best == kept_.end() || it->capacity() < best->capacity())) best = it;
    }
    if (best == kept_.end()) {
      ++num_allocated_;
    } else {
      ++num_reused_;
      num_kept_bytes_ -= best->capacity();
      found = remove(kept_, best);
    }
  }
  // Outside the lock: a fresh allocation (and its zeroing) is the slow case this pool avoids.
  // A reused buffer shrinks for free; it is zeroed only where it grows within its capacity.
  found.resize(bytes);
  return found;
}

void kv_buffer_pool::give_back(std::vector<std::byte> buffer) {
  const size_t capacity = buffer.capacity();
  if (capacity == 0) return;
  buffer_list freed;  // freed after the lock is released: a free of MiBs may unmap pages
  std::lock_guard lock(mutex_);
  if (capacity <= max_bytes_) {
    // Full: smaller kept buffers make way for a bigger one (the frames grew); never the reverse.
    while (kept_.size() >= max_buffers_ || num_kept_bytes_ + capacity > max_bytes_) {
      auto least = smallest(kept_);
      if (least == kept_.end() || least->capacity() >= capacity) break;
      num_kept_bytes_ -= least->capacity();
      freed.push_back(remove(kept_, least));
    }
    if (kept_.size() < max_buffers_ && num_kept_bytes_ + capacity <= max_bytes_) {
      num_kept_bytes_ += capacity;
      kept_.push_back(std::move(buffer));
      return;
    }
  }
  freed.push_back(std::move(buffer));
}

void kv_buffer_pool::trim_to(size_t max_bytes) {
  buffer_list freed;
  std::lock_guard lock(mutex_);
  while (num_kept_bytes_ > max_bytes) {
    auto largest = std::max_element(kept_.begin(), kept_.end(),
                                    [](const auto& a, const auto& b) { return a.capacity() < b.capacity(); });
    num_kept_bytes_ -= largest->capacity();
    freed.push_back(remove(kept_, largest));
  }
}

void kv_buffer_pool::release_if_idle(std::chrono::steady_clock::time_point now, std::chrono::milliseconds idle) {
  buffer_list freed;
  std::lock_guard lock(mutex_);
  if (kept_.empty() || now - last_take_ < idle) return;
  freed.swap(kept_);
  kept_.reserve(max_buffers_);
  num_kept_bytes_ = 0;
}

kv_buffer_pool_stats kv_buffer_pool::stats() const {
  std::lock_guard lock(mutex_);
  return {num_reused_, num_allocated_, kept_.size(), num_kept_bytes_};
}

}  // namespace troupe
