#include "kvtransfer/nccl_kv_copier.hpp"

#include <algorithm>
#include <stdexcept>

#include "kvtransfer/device_kv_runs.hpp"
#include "kvtransfer/nccl_pool_handle.hpp"

namespace troupe {

namespace {

bool never() { return false; }

}  // namespace

nccl_kv_copier::nccl_kv_copier(device_kv_pool local, std::shared_ptr<kv_pair_links> links)
    : local_(local), links_(std::move(links)) {
  if (!links_) throw std::invalid_argument("nccl kv copier: no links to join pairs with");
}

void nccl_kv_copier::copy_to(const std::string& peer_handle, std::span<const int32_t> local_blocks,
                             std::span<const int32_t> peer_blocks, int first_layer, int num_layers,
                             std::chrono::steady_clock::time_point deadline) {
  const nccl_pool_handle& handle = parsed(peer_handle);
  if (std::find(dead_ids_.begin(), dead_ids_.end(), handle.pair_id) != dead_ids_.end()) {
    throw std::runtime_error(
        "nccl kv copier: the transfer names a pair that broke earlier (the decode side makes a "
        "new one for its next transfer)");
  }
  auto it = pairs_.find(handle.pair_id);
  try {
    // NCCL pairs sizes, not shapes: the receiver's pool must be this one's, checked here. The
    // frame is out already, so a refusal breaks the pair on both sides like any failure.
    device_kv_runs(local_, local_blocks, handle.geometry, peer_blocks, first_layer, num_layers);
    if (it == pairs_.end()) {
      it = pairs_.emplace(handle.pair_id, pair{links_->join(handle.pair_id, kv_pair_side::prefill, deadline, never), 0})
               .first;
    }
    it->second.link->post(local_blocks, first_layer, num_layers, deadline, never);
    ++it->second.num_posted;
  } catch (const std::exception&) {
    drop(handle.pair_id);
    throw;
  }
}

void nccl_kv_copier::complete(const std::string& peer_handle, std::chrono::steady_clock::time_point deadline) {
  const nccl_pool_handle& handle = parsed(peer_handle);
  auto it = pairs_.find(handle.pair_id);
  if (it == pairs_.end()) return;  // nothing posted (or dropped, and that transfer broke then)
  try {
    it->second.link->wait(deadline, never);
  } catch (const std::exception&) {
    drop(handle.pair_id);
    throw;
  }
}

uint64_t nccl_kv_copier::next_sequence(const std::string& peer_handle) {
  try {
    auto it = pairs_.find(parsed(peer_handle).pair_id);
    return it == pairs_.end() ? 0 : it->second.num_posted;
  } catch (const std::invalid_argument&) {
    return 0;  // not a handle: copy_to refuses it, naming why
  }
}

const nccl_pool_handle& nccl_kv_copier::parsed(const std::string& peer_handle) {
  if (peer_handle != last_handle_ || last_handle_.empty()) {
    last_parsed_ = decode_nccl_pool_handle(peer_handle);  // throws before the cache changes
    last_handle_ = peer_handle;
  }
  return last_parsed_;
}

void nccl_kv_copier::drop(const std::string& pair_id) {
  pairs_.erase(pair_id);
  if (std::find(dead_ids_.begin(), dead_ids_.end(), pair_id) != dead_ids_.end()) return;
  dead_ids_.push_back(pair_id);
  if (dead_ids_.size() > max_dead_ids) dead_ids_.pop_front();
}

}  // namespace troupe
