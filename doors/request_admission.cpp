#include "doors/request_admission.hpp"

#include <random>
#include <stdexcept>
#include <string>

namespace troupe {

request_admission::request_admission(int64_t max_in_flight, uint32_t controller_id)
    : max_in_flight_(max_in_flight), controller_id_(controller_id) {
  if (controller_id > max_controller_id) {
    throw std::invalid_argument("request_admission: controller id " + std::to_string(controller_id) +
                                " does not fit in " + std::to_string(controller_id_bits) + " bits (at most " +
                                std::to_string(max_controller_id) + ")");
  }
}

uint32_t request_admission::random_controller_id() {
  std::random_device entropy;
  return std::uniform_int_distribution<uint32_t>(0, max_controller_id)(entropy);
}

std::optional<int64_t> request_admission::admit(client_door door, int count) {
  int64_t held = num_in_flight_.load();
  do {
    if (count <= 0 || held + count > max_in_flight_.load()) {
      ++num_refused_[static_cast<int>(door)];
      return std::nullopt;
    }
  } while (!num_in_flight_.compare_exchange_weak(held, held + count));
  num_admitted_[static_cast<int>(door)] += static_cast<uint64_t>(count);
  // The sequence wraps within its bits (after 1.4e14 ids) rather than spill into the controller's.
  const int64_t sequence_mask = (int64_t(1) << sequence_bits) - 1;
  const int64_t first_sequence = next_sequence_.fetch_add(count) & sequence_mask;
  return (static_cast<int64_t>(controller_id_) << (sequence_bits + door_bits)) | (first_sequence << door_bits) |
         static_cast<int64_t>(door);
}

void request_admission::release(int count) { num_in_flight_ -= count; }

void request_admission::close(const std::string& reason) {
  std::lock_guard lock(closed_mutex_);
  if (closed_) return;
  closed_reason_ = reason;
  closed_ = true;
}

std::optional<std::string> request_admission::closed_reason() const {
  if (!closed_) return std::nullopt;
  std::lock_guard lock(closed_mutex_);
  return closed_reason_;
}

}  // namespace troupe
