#pragma once
// The prefill side of kv_transport "nccl": kvtransfer/kv_layer_streamer's device copier. One pair
// channel per decode peer's pair id (the id in the kv_pool_handle its kv_ready named; see
// nccl_kv_inbox), joined on first use, bounded by the transfer's deadline.
//
// Order matters with NCCL, unlike CUDA IPC: the receiver posts its ncclRecv when the layer's
// in-place frame arrives, so kv_layer_streamer queues the frame FIRST (frame_first) and then
// copy_to posts that layer's sends on the channel's own stream, without waiting: the forward
// goes on to the next layer while NCCL moves this one. complete() waits for them (bounded by the
// deadline), after the step's forward and before its blocks can be used again.
//
// A channel that failed is dropped and its id remembered as dead (bounded): the decode side has
// broken that pair too and makes a new id for the next transfer, and a transfer still naming the
// old one fails at once instead of waiting for a peer that will never join.
//
// Not thread-safe: the worker's forward thread only.

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "kvtransfer/device_kv_copier.hpp"
#include "kvtransfer/kv_pair_link.hpp"
#include "kvtransfer/nccl_pool_handle.hpp"
#include "model/model.hpp"

namespace troupe {

class nccl_kv_copier final : public device_kv_copier {
 public:
  nccl_kv_copier(device_kv_pool local, std::shared_ptr<kv_pair_links> links);

  bool frame_first() const override { return true; }
  // The number of copy_to calls posted to the pair so far (0 for one not joined yet).
  uint64_t next_sequence(const std::string& peer_handle) override;
  // Posts the sends of layers [first_layer, first_layer + num_layers) of local_blocks to the pair
  // `peer_handle` names (peer_blocks are the receiver's, checked against the handle's geometry
  // with the layers and ids before anything is posted). Throws std::invalid_argument for those
  // checks or a handle that is not one, std::runtime_error for a dead pair or a failed post.
  void copy_to(const std::string& peer_handle, std::span<const int32_t> local_blocks,
               std::span<const int32_t> peer_blocks, int first_layer, int num_layers,
               std::chrono::steady_clock::time_point deadline) override;
  void complete(const std::string& peer_handle, std::chrono::steady_clock::time_point deadline) override;

  size_t num_pairs() const { return pairs_.size(); }

 private:
  void drop(const std::string& pair_id);
  // The handle decoded, the last one kept: every layer of a step names the same few handles.
  const nccl_pool_handle& parsed(const std::string& peer_handle);

  static constexpr size_t max_dead_ids = 256;
  device_kv_pool local_;
  std::shared_ptr<kv_pair_links> links_;
  struct pair {
    std::unique_ptr<kv_pair_link> link;
    uint64_t num_posted = 0;
  };
  std::map<std::string, pair> pairs_;  // by pair id
  std::deque<std::string> dead_ids_;   // oldest first
  std::string last_handle_;
  nccl_pool_handle last_parsed_;
};

}  // namespace troupe
