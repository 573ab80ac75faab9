#include "kvtransfer/kv_lease_table.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace troupe {

std::string kv_transfer_name(uint64_t transfer_id, int64_t request_id) {
  return "KV transfer " + std::to_string(transfer_id) + " (request " + std::to_string(request_id) + ")";
}

kv_lease_table::kv_lease_table(const model_config& config, kv_cache_shape pool, bool device_pairs)
    : num_layers_(config.num_layers),
      num_kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim),
      pool_(pool),
      device_pairs_(device_pairs) {}

void kv_lease_table::expect(kv_expectation e) {
  const std::string name = kv_transfer_name(e.transfer_id, e.request_id);
  if (e.num_tokens <= 0)
    throw std::invalid_argument(name + ": num_tokens " + std::to_string(e.num_tokens) + " is not positive");
  const int64_t blocks_needed = (int64_t{e.num_tokens} + pool_.block_size - 1) / pool_.block_size;
  if (static_cast<int64_t>(e.block_ids.size()) < blocks_needed) {
    throw std::invalid_argument(name + ": " + std::to_string(e.block_ids.size()) + " block_ids for " +
                                std::to_string(e.num_tokens) + " tokens, which need " + std::to_string(blocks_needed));
  }
  std::set<int32_t> seen;
  for (int32_t id : e.block_ids) {
    if (id < 0 || id >= pool_.num_blocks) {
      throw std::invalid_argument(name + ": block id " + std::to_string(id) + " is outside the pool of " +
                                  std::to_string(pool_.num_blocks) + " blocks");
    }
    if (!seen.insert(id).second)
      throw std::invalid_argument(name + ": block id " + std::to_string(id) + " appears twice");
  }
  if (!e.device_pair.empty() && (!device_pairs_ || !e.in_place)) {
    throw std::invalid_argument(name +
                                ": a device_pair needs an in-place expectation and a receiver with an nccl inbox");
  }
  e.layers = e.layers.resolved(num_layers_);
  if (e.layers.first < 0 || e.layers.end > num_layers_ || e.layers.count() < 1) {
    throw std::invalid_argument(name + ": layers " + layer_range_text(e.layers) + " are not a range of the model's " +
                                std::to_string(num_layers_) + " layers");
  }
  if (e.relayed.count() > 0 && (e.in_place || e.relayed.first < e.layers.first || e.relayed.end > e.layers.end)) {
    throw std::invalid_argument(name + ": relayed layers " + layer_range_text(e.relayed) +
                                " must lie inside the lease's layers, on a lease whose other frames carry bytes");
  }
  if (leases_.contains(e.transfer_id)) throw std::invalid_argument(name + ": transfer_id is already expected");
  const uint64_t id = e.transfer_id;
  // The layers outside the lease count as arrived: they are another stage's to receive.
  std::vector<int32_t> outside(num_layers_, 0);
  for (int layer = 0; layer < num_layers_; ++layer) {
    if (!e.layers.holds(layer)) outside[static_cast<size_t>(layer)] = e.num_tokens;
  }
  leases_.emplace(id, kv_lease{std::move(e), outside, outside});
}

std::optional<std::string> kv_lease_table::cancel(uint64_t transfer_id) {
  auto it = leases_.find(transfer_id);
  if (it == leases_.end()) return std::nullopt;
  std::string device_pair = std::move(it->second.expectation.device_pair);
  leases_.erase(it);
  return device_pair;
}

kv_frame_verdict kv_lease_table::admit(const kv_frame_header& h, size_t payload_size) {
  auto it = leases_.find(h.transfer_id);
  if (it == leases_.end()) {
    // A late frame of a cancelled or timed-out transfer is normal: refused, nothing failed.
    return {
        nullptr,
        kv_transfer_name(h.transfer_id, h.request_id) + " is not expected (unknown, finished, cancelled or timed out)",
        std::nullopt};
  }
  const std::string why = mismatch(it->second, h, payload_size);
  if (why.empty()) return {&it->second, {}, std::nullopt};
  return fail(h.transfer_id, why);
}

std::span<const int32_t> kv_lease_table::blocks_of(const kv_lease& lease, const kv_frame_header& h) const {
  // mismatch() checked that the frame's range lies inside the lease's blocks.
  const int32_t first_block = h.token_begin / pool_.block_size;
  return {lease.expectation.block_ids.data() + first_block, static_cast<size_t>(h.span.num_blocks)};
}

void kv_lease_table::accept(kv_lease& lease, const kv_frame_header& h) {
  for (int layer = h.span.first_layer; layer < h.span.first_layer + h.span.num_layers; ++layer) {
    lease.num_accepted[layer] = std::max(lease.num_accepted[layer], h.token_end);
  }
}

std::optional<kv_lease_outcome> kv_lease_table::book(const kv_frame_header& h) {
  auto it = leases_.find(h.transfer_id);
  if (it == leases_.end()) return std::nullopt;
  kv_lease& lease = it->second;
  for (int layer = h.span.first_layer; layer < h.span.first_layer + h.span.num_layers; ++layer) {
    lease.num_received[layer] = std::max(lease.num_received[layer], h.token_end);
    lease.num_accepted[layer] = std::max(lease.num_accepted[layer], h.token_end);
  }
  const int32_t num_tokens = lease.expectation.num_tokens;
  if (!std::all_of(lease.num_received.begin(), lease.num_received.end(), [&](int32_t n) { return n >= num_tokens; })) {
    return std::nullopt;
  }
  kv_lease_outcome done{true, h.transfer_id, lease.expectation.request_id, {}, {}};
  leases_.erase(it);
  return done;
}

kv_frame_verdict kv_lease_table::fail(uint64_t transfer_id, const std::string& why) {
  auto it = leases_.find(transfer_id);
  if (it == leases_.end()) return {nullptr, why, std::nullopt};
  const kv_expectation& e = it->second.expectation;
  const std::string name = kv_transfer_name(transfer_id, e.request_id);
  // The frame came from this transfer's sender, which is broken: the transfer cannot finish.
  kv_frame_verdict verdict{nullptr, name + ": " + why,
                           kv_lease_outcome{false, transfer_id, e.request_id, name + " failed: " + why, e.device_pair}};
  leases_.erase(it);
  return verdict;
}

std::vector<kv_lease_outcome> kv_lease_table::expire(std::chrono::steady_clock::time_point now) {
  std::vector<kv_lease_outcome> expired;
  for (auto it = leases_.begin(); it != leases_.end();) {
    const kv_expectation& e = it->second.expectation;
    if (e.deadline > now) {
      ++it;
      continue;
    }
    const auto least = std::min_element(it->second.num_received.begin(), it->second.num_received.end());
    const std::string name = kv_transfer_name(e.transfer_id, e.request_id);
    expired.push_back({false, e.transfer_id, e.request_id,
                       name + " failed: its deadline passed with layer " +
                           std::to_string(least - it->second.num_received.begin()) + " at " + std::to_string(*least) +
                           " of " + std::to_string(e.num_tokens) + " tokens",
                       e.device_pair});
    it = leases_.erase(it);
  }
  return expired;
}

const kv_lease* kv_lease_table::find(uint64_t transfer_id) const {
  auto it = leases_.find(transfer_id);
  return it == leases_.end() ? nullptr : &it->second;
}

std::string kv_lease_table::mismatch(const kv_lease& lease, const kv_frame_header& h, size_t payload_size) const {
  const kv_expectation& e = lease.expectation;
  if (h.request_id != e.request_id) {
    return "the frame names request " + std::to_string(h.request_id) + ", the transfer is for request " +
           std::to_string(e.request_id);
  }
  if (h.gave_up) {  // its sender's last word: nothing of a span to fit
    return h.payload_bytes == payload_size ? std::string()
                                           : "the give-up frame announces " + std::to_string(h.payload_bytes) +
                                                 " bytes of reason, it has " + std::to_string(payload_size);
  }
  if (int64_t{h.span.first_layer} + h.span.num_layers > num_layers_) {
    return "layer range first " + std::to_string(h.span.first_layer) + " count " + std::to_string(h.span.num_layers) +
           " lies outside the model's " + std::to_string(num_layers_) + " layers";
  }
  const layer_range frame_layers{h.span.first_layer, h.span.first_layer + h.span.num_layers};
  if (h.span.num_layers < 1 || frame_layers.first < e.layers.first || frame_layers.end > e.layers.end) {
    return "the frame's layers " + layer_range_text(frame_layers) + " are not among the transfer's (" +
           layer_range_text(e.layers) + ")";
  }
  const bool relayed =
      e.relayed.count() > 0 && frame_layers.first >= e.relayed.first && frame_layers.end <= e.relayed.end;
  const bool touches_relayed = frame_layers.first < e.relayed.end && e.relayed.first < frame_layers.end;
  if (touches_relayed && !(relayed && h.in_place)) {
    return "the frame's layers " + layer_range_text(frame_layers) + " come from the decode's pipeline stages (" +
           layer_range_text(e.relayed) + "), which say so in place; " +
           (h.in_place ? "the frame reaches past them" : "the frame carries bytes");
  }
  if (relayed) {
    // The stage vouches for all of its tokens at once, after they are in its blocks.
    if (h.payload_bytes != 0 || h.sequenced || h.token_begin != 0 || h.token_end != e.num_tokens) {
      return "a stage's in-place frame must cover tokens [0, " + std::to_string(e.num_tokens) +
             ") with no payload; it covers [" + std::to_string(h.token_begin) + ", " + std::to_string(h.token_end) +
             ")";
    }
  } else if (h.in_place != e.in_place) {
    return h.in_place
               ? "the frame says its KV was written in place (a device transport), the transfer expects its bytes"
               : "the frame carries bytes, the transfer expects its KV written in place by a device transport";
  }
  if (h.sequenced != !e.device_pair.empty()) {
    return h.sequenced ? "the frame carries a pair sequence, the transfer is not received over an nccl pair"
                       : "the frame carries no pair sequence, the transfer is received over an nccl pair (kv_transport "
                         "\"nccl\")";
  }
  if (h.payload_bytes != payload_size) {
    return "the header announces payload_bytes " + std::to_string(h.payload_bytes) + ", the payload has " +
           std::to_string(payload_size);
  }
  if (h.span.block_size != pool_.block_size || h.span.num_kv_heads != num_kv_heads_ || h.span.head_dim != head_dim_) {
    return "geometry block_size " + std::to_string(h.span.block_size) + ", num_kv_heads " +
           std::to_string(h.span.num_kv_heads) + ", head_dim " + std::to_string(h.span.head_dim) +
           " differs from the model's " + std::to_string(pool_.block_size) + ", " + std::to_string(num_kv_heads_) +
           ", " + std::to_string(head_dim_);
  }
  if (h.token_end > e.num_tokens) {
    return "token_end " + std::to_string(h.token_end) + " is past the transfer's " + std::to_string(e.num_tokens) +
           " tokens";
  }
  for (int layer = h.span.first_layer; layer < h.span.first_layer + h.span.num_layers; ++layer) {
    if (h.token_begin > lease.num_accepted[layer]) {
      return "token_begin " + std::to_string(h.token_begin) + " of layer " + std::to_string(layer) +
             " leaves a gap: tokens [0, " + std::to_string(lease.num_accepted[layer]) + ") have arrived";
    }
  }
  return {};
}

}  // namespace troupe
