#pragma once
// The decode side of kv_transport "nccl": one pair channel per prefill peer, each with ONE thread
// that runs that peer's receives in the order their in-place frames arrived (NCCL pairs a
// receive with the peer's sends in posting order). A slow or dead peer stalls only its own
// transfers: not the KV receiver's thread, not another peer's.
//
// The pair's id is made here, one per prefill peer (handle_for), and leaves in the kv_ready_msg's
// kv_pool_handle (nccl_pool_handle: the id and this pool's geometry) over the cluster's
// authenticated control path; the channel is joined lazily, on the pair's thread, by its first
// receive and bounded by that receive's deadline.
//
// In order means in step: a send the prefill side posted for a transfer this side no longer
// receives (cancelled, failed, timed out) would be paired with the next transfer's receive. So a
// transfer that ends other than complete breaks its pair (end()), as does any failed receive: its
// queued receives fail, its channel is aborted, and the peer's next transfer gets a new id and a
// new channel. The cost is that a cancel fails the other transfers in flight from that peer (the
// router runs them again); draining the unmatched sends into scratch blocks would avoid it.
//
// Thread-safe. `done` callbacks run on a pair's thread, without this class's lock held.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvtransfer/kv_pair_link.hpp"
#include "model/model.hpp"

namespace troupe {

struct nccl_kv_receive {
  uint64_t transfer_id = 0;
  std::vector<int32_t> blocks;  // this pool's blocks, in the order the peer sends them
  int first_layer = 0;
  int num_layers = 0;
  std::chrono::steady_clock::time_point deadline;
  // "" once the blocks are in, else why not (the pair is then broken).
  std::function<void(const std::string& why)> done;
};

class nccl_kv_inbox {
 public:
  struct handle {
    std::string bytes;    // the kv_pool_handle for the peer's kv_ready_msg
    std::string pair_id;  // what the transfer's receives name
  };

  // `pool`: this process's (its geometry goes in every handle); `links` joins the pairs.
  nccl_kv_inbox(device_kv_pool pool, std::shared_ptr<kv_pair_links> links, size_t max_pairs = 64,
                size_t max_held = 4096);
  ~nccl_kv_inbox();  // close()
  nccl_kv_inbox(const nccl_kv_inbox&) = delete;
  nccl_kv_inbox& operator=(const nccl_kv_inbox&) = delete;

  // The handle of `peer`'s pair: the same until the pair breaks, then a new id. Throws
  // std::invalid_argument for an empty peer or when max_pairs pairs are live, std::runtime_error
  // when closed or the id cannot be made.
  handle handle_for(const std::string& peer);
  // Queues a receive on pair `pair_id`'s thread as the `sequence`th of the pair (0, 1, ...: the
  // order the prefill side posted its sends, from the in-place frame): a receive that arrives
  // before one it follows is held until the gap is filled, bounded by max_held and by its
  // deadline (a gap never filled stalls the pair; the transfers then fail and break it). Throws
  // std::runtime_error naming why when the pair is unknown or broken, the sequence was queued
  // already, or max_held receives are held (the caller fails the transfer; nothing was queued).
  void receive(const std::string& pair_id, uint64_t sequence, nccl_kv_receive r);
  // A transfer of the pair ended other than complete: the pair is broken (see above). Returns
  // once no receive of it is writing (its thread gives up at once: the link polls a stop flag;
  // bounded by the receive's deadline in any case). Unknown ids: nothing.
  void end(const std::string& pair_id, const std::string& why);
  // Stops every pair's thread; queued receives are dropped without their callbacks.
  void close();

  size_t num_pairs() const;  // live (not broken)

 private:
  struct pair;
  void run(const std::shared_ptr<pair>& p);
  void break_locked(pair& p, const std::string& why);
  void reap_locked(std::vector<std::thread>& finished);

  const device_kv_pool pool_;
  const std::shared_ptr<kv_pair_links> links_;
  const size_t max_pairs_;
  const size_t max_held_;
  mutable std::mutex mutex_;
  std::condition_variable idle_;                        // a pair's receive finished
  std::map<std::string, std::shared_ptr<pair>> pairs_;  // by id, broken ones until their thread ends
  std::map<std::string, std::string> live_id_of_peer_;
  bool closed_ = false;
};

}  // namespace troupe
