#pragma once
// NCCL between hosts (kv_transport "nccl"; compiled where CUDA and NCCL are found).
//
// One communicator of two ranks per prefill/decode pair: the decode side makes the unique id
// (make_nccl_unique_id) and it travels in the transfer setup over the cluster's authenticated
// control path (never over the KV socket itself); both sides then join with it, the prefill side
// as rank 0 (sends), the decode side as rank 1 (receives). For each layer the prefill side queues
// an in-place frame header on the ZeroMQ path and sends the layer's blocks with ncclSend; the
// decode side, having checked the header against its lease (kv_receiver), receives them with
// ncclRecv straight into its reserved blocks. One send/receive per block of each side of each
// layer, all in one NCCL group: the two sides' block ids differ, so runs consecutive on one side
// are not on the other, and NCCL pairs sends and receives of equal size in order.
//
// NCCL blocks a rank whose peer never posts the matching call. Every wait here is bounded by a
// deadline (the transfer's): the communicator is made non-blocking, polled, and aborted when the
// deadline passes; a channel that aborted is broken() and must be replaced.
//
// Served (nccl_kv_inbox on the decode side, nccl_kv_copier on the prefill side) through the
// kv_pair_link interface: post() queues a layer's group on the channel's own stream and returns,
// wait() polls it to completion; both also give up when the caller's stop flag says so.
//
// Not thread-safe: one channel per pair, used from one thread.

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kvtransfer/kv_pair_link.hpp"
#include "model/model.hpp"

namespace troupe {

// A fresh ncclUniqueId as bytes (the decode side makes it). Throws std::runtime_error naming
// the NCCL error.
std::string make_nccl_unique_id();

// The pair links of `pool` (the ids are make_nccl_unique_id's, the links nccl_kv_channels).
std::shared_ptr<kv_pair_links> make_nccl_pair_links(device_kv_pool pool);

class nccl_kv_channel final : public kv_pair_link {
 public:
  using side = kv_pair_side;  // rank 0 (prefill) sends, rank 1 (decode) receives

  // Joins the pair's communicator on pool.device: a collective, so the peer must join with the
  // same id before `deadline`. Throws std::invalid_argument for an id of the wrong size,
  // std::runtime_error (NCCL's reason, or the deadline) otherwise; nothing is left open then.
  nccl_kv_channel(device_kv_pool pool, const std::string& unique_id, side s,
                  std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop = {});
  ~nccl_kv_channel() override;
  nccl_kv_channel(const nccl_kv_channel&) = delete;
  nccl_kv_channel& operator=(const nccl_kv_channel&) = delete;

  // The prefill side sends layers [first_layer, first_layer + num_layers) of `blocks`; the decode
  // side receives that many blocks, in the same order, into `blocks`. Returns once complete.
  // Throws std::invalid_argument (ids or layers outside the pool, a receiving id twice) before
  // anything is posted, std::runtime_error on an NCCL error or at the deadline (the channel is
  // then aborted and broken()).
  void transfer(std::span<const int32_t> blocks, int first_layer, int num_layers,
                std::chrono::steady_clock::time_point deadline);
  // transfer's two halves (kv_pair_link): posted on the channel's stream, then waited for.
  void post(std::span<const int32_t> blocks, int first_layer, int num_layers,
            std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop) override;
  void wait(std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop) override;
  bool broken() const override { return broken_; }

 private:
  void wait_for_comm(std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop, const char* what);
  [[noreturn]] void abort(const std::string& why);

  device_kv_pool pool_;
  side side_;
  void* comm_ = nullptr;    // ncclComm_t
  void* stream_ = nullptr;  // cudaStream_t
  void* done_ = nullptr;    // cudaEvent_t
  bool broken_ = false;
};

}  // namespace troupe
