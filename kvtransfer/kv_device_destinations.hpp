#pragma once
// What the prefill's streamer must know of a transfer's destination before the transfer's first
// step computes, as the decode side's kv_ready named it: where a device transport writes the KV
// (the decode side's pool handle and the blocks it reserved), or, for a pipelined prefill that
// streams over a KV channel per pair of stages, the decode stages' receivers (possibly none: a
// decode instance that is no pipeline). The prefill worker's KV agent puts them here when the
// router forwards the kv_ready; the worker's forward thread takes them before the step that
// computes the transfer's first layer (kvtransfer/kv_layer_streamer). The two meet in either order: the
// router sends the request and the decode side's answer independently, so the prefill step may
// come first and then waits, bounded by the transfer's deadline.
//
// A lease like the sender's early readies: an entry nobody takes is dropped at its deadline, and
// the number held is bounded. Thread-safe.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvtransfer/kv_stage_pairs.hpp"

namespace troupe {

struct kv_device_destination {
  std::string pool_handle;         // device_kv_pool_handle bytes of the decode side's pool
  std::vector<int32_t> block_ids;  // its blocks for tokens [0, num_tokens) of the request
  // Without a pool handle: the decode stages' receivers for their layers (kv_stage_pairs.hpp).
  std::vector<kv_stage_route> stage_routes;
};

class kv_device_destinations {
 public:
  explicit kv_device_destinations(size_t max_held = 4096) : max_held_(max_held) {}

  // Keeps `destination` for `transfer_id` until taken or `deadline`. Throws std::invalid_argument
  // naming what is wrong: a handle above max_kv_pool_handle_bytes, a handle without blocks or with
  // stage routes, blocks without a handle, more than kv_stage_routes_max routes, or max_held entries already held
  // (expired ones are dropped first).
  void put(uint64_t transfer_id, kv_device_destination destination, std::chrono::steady_clock::time_point deadline);
  // The destination of `transfer_id`, removed from here; waits for it until `deadline` (nullopt
  // then).
  std::optional<kv_device_destination> take(uint64_t transfer_id, std::chrono::steady_clock::time_point deadline);
  // Drops an entry nobody will take (the transfer was cancelled). Unknown ids: nothing.
  void erase(uint64_t transfer_id);
  size_t num_held() const;

 private:
  struct held {
    kv_device_destination destination;
    std::chrono::steady_clock::time_point deadline;
  };
  void drop_expired(std::chrono::steady_clock::time_point now);

  const size_t max_held_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::unordered_map<uint64_t, held> held_;
};

}  // namespace troupe
