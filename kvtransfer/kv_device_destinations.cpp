#include "kvtransfer/kv_device_destinations.hpp"

#include <stdexcept>

#include "kvtransfer/device_kv_copier.hpp"

namespace troupe {

void kv_device_destinations::put(uint64_t transfer_id, kv_device_destination destination,
                                 std::chrono::steady_clock::time_point deadline) {
  const std::string named = "kv transfer " + std::to_string(transfer_id) + ": ";
  if (destination.pool_handle.size() > max_kv_pool_handle_bytes) {
    throw std::invalid_argument(named + "a pool handle of " + std::to_string(destination.pool_handle.size()) +
                                " bytes, at most " + std::to_string(max_kv_pool_handle_bytes));
  }
  const bool device = !destination.pool_handle.empty();
  if (device && destination.block_ids.empty()) {
    throw std::invalid_argument(named + "the device destination names no blocks");
  }
  if (!device && !destination.block_ids.empty()) {
    throw std::invalid_argument(named + "a destination without a pool handle names blocks");
  }
  if (device && !destination.stage_routes.empty()) {
    throw std::invalid_argument(named + "a device destination with KV stage routes");
  }
  if (destination.stage_routes.size() > kv_stage_routes_max) {
    throw std::invalid_argument(named + std::to_string(destination.stage_routes.size()) + " KV stage routes, at most " +
                                std::to_string(kv_stage_routes_max));
  }
  {
    std::lock_guard lock(mutex_);
    drop_expired(std::chrono::steady_clock::now());
    if (!held_.count(transfer_id) && held_.size() >= max_held_) {
      throw std::invalid_argument(named + std::to_string(max_held_) + " device destinations are held already");
    }
    held_[transfer_id] = held{std::move(destination), deadline};
  }
  arrived_.notify_all();
}

std::optional<kv_device_destination> kv_device_destinations::take(uint64_t transfer_id,
                                                                  std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  if (!arrived_.wait_until(lock, deadline, [&] { return held_.count(transfer_id) > 0; })) return std::nullopt;
  auto it = held_.find(transfer_id);
  kv_device_destination destination = std::move(it->second.destination);
  held_.erase(it);
  return destination;
}

void kv_device_destinations::erase(uint64_t transfer_id) {
  std::lock_guard lock(mutex_);
  held_.erase(transfer_id);
}

size_t kv_device_destinations::num_held() const {
  std::lock_guard lock(mutex_);
  return held_.size();
}

void kv_device_destinations::drop_expired(std::chrono::steady_clock::time_point now) {
  std::erase_if(held_, [now](const auto& entry) { return entry.second.deadline <= now; });
}

}  // namespace troupe
