#pragma once
// One side of a prefill/decode pair's device channel (kv_transport "nccl"): the prefill side's
// sends and the decode side's receives pair up in the order they are posted, the way NCCL pairs
// ncclSend with ncclRecv. nccl_kv_channel is the real one (compiled where NCCL is); the
// interface lets nccl_kv_inbox (decode) and nccl_kv_copier (prefill) be built and tested on a
// machine without a GPU, with links of the test's own that pair in memory.
//
// Every wait is bounded by a deadline and by `stop` (polled): a link that gave up is broken()
// for good, and its owner makes a new one (with a new id) next time.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace troupe {

enum class kv_pair_side { prefill, decode };  // rank 0 sends, rank 1 receives

// Polled by a link's waits: true gives up at once (the channel is aborted and broken).
using kv_link_stop = std::function<bool()>;

class kv_pair_link {
 public:
  virtual ~kv_pair_link() = default;
  // Posts the sends (prefill) or receives (decode) of layers [first_layer, first_layer +
  // num_layers) of `blocks`, after those posted before, and returns without waiting for them to
  // complete. Throws std::invalid_argument (ids or layers outside the pool) before anything is
  // posted, std::runtime_error (the link is then broken) when posting failed or outlived
  // `deadline`.
  virtual void post(std::span<const int32_t> blocks, int first_layer, int num_layers,
                    std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop) = 0;
  // Returns once everything posted so far is complete. Throws std::runtime_error naming why at
  // `deadline`, when `stop` says so, or on a failure; the link is then broken.
  virtual void wait(std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop) = 0;
  virtual bool broken() const = 0;
};

// Makes the ids and joins the links of one process's pool.
class kv_pair_links {
 public:
  virtual ~kv_pair_links() = default;
  // A fresh id for a new pair (the decode side makes it, one per prefill peer).
  virtual std::string make_id() = 0;
  // Joins the pair `id` names as `side`: the peer must join with the same id before `deadline`
  // (and before `stop`). Throws std::invalid_argument for an id that is not one, std::runtime_error
  // otherwise (nothing is left open then).
  virtual std::unique_ptr<kv_pair_link> join(const std::string& id, kv_pair_side side,
                                             std::chrono::steady_clock::time_point deadline,
                                             const kv_link_stop& stop) = 0;
};

}  // namespace troupe
