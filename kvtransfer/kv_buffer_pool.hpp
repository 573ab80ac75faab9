#pragma once
// Payload buffers recycled between the exporter and the KV sender: a frame's buffer goes back
// here once its bytes have left (written to a plain TCP socket, freed by ZeroMQ after its I/O
// thread sent it, copied by a receiver of this process, or dropped by a cancel or a deadline),
// and the exporter's next frame takes it instead of a fresh allocation. A fresh multi-MiB
// allocation per frame is what cost the plane its throughput: the allocator purged each freed
// frame and page-faulted the next one in (docs/benchmarks.md, "KV transfer").
//
// Bounded: at most max_buffers buffers and max_bytes of capacity are kept; a buffer given back
// beyond that is freed (or replaces a smaller kept one: frames grew), and release_if_idle frees
// everything once nobody has taken a buffer for a while, so an idle sender holds no memory.
//
// Thread safety: every call may come from any thread (give_back comes on ZeroMQ's I/O thread).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace troupe {

struct kv_buffer_pool_stats {
  uint64_t num_reused = 0;     // take() served from a kept buffer
  uint64_t num_allocated = 0;  // take() that allocated
  size_t num_kept = 0;         // buffers kept now
  size_t num_kept_bytes = 0;   // their capacity
};

class kv_buffer_pool {
 public:
  kv_buffer_pool(size_t max_buffers, size_t max_bytes);

  // A buffer of size() == bytes: the smallest kept one whose capacity fits, else a new one. Its
  // contents are unspecified (the caller overwrites every byte).
  std::vector<std::byte> take(size_t bytes);
  // Keeps `buffer` for a later take() when the bounds allow it, frees it otherwise.
  void give_back(std::vector<std::byte> buffer);
  // Frees kept buffers, largest first, until at most `max_bytes` of capacity remain (the sender
  // calls it when its queue plus what is kept would pass its own limit).
  void trim_to(size_t max_bytes);
  // Frees every kept buffer if no take() came in the last `idle`.
  void release_if_idle(std::chrono::steady_clock::time_point now, std::chrono::milliseconds idle);
  kv_buffer_pool_stats stats() const;

 private:
  const size_t max_buffers_;
  const size_t max_bytes_;
  mutable std::mutex mutex_;
  std::vector<std::vector<std::byte>> kept_;  // unordered; at most max_buffers_
  size_t num_kept_bytes_ = 0;
  uint64_t num_reused_ = 0;
  uint64_t num_allocated_ = 0;
  std::chrono::steady_clock::time_point last_take_;
};

}  // namespace troupe
