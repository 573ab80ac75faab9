#include "doors/request_admission.hpp"

namespace troupe {

std::optional<int64_t> request_admission::admit(client_door door, int count) {
  int64_t held = num_in_flight_.load();
  do {
    if (count <= 0 || held + count > max_in_flight_) {
      ++num_refused_[static_cast<int>(door)];
      return std::nullopt;
    }
  } while (!num_in_flight_.compare_exchange_weak(held, held + count));
  num_admitted_[static_cast<int>(door)] += static_cast<uint64_t>(count);
  const int64_t first_sequence = next_sequence_.fetch_add(count);
  return (first_sequence << door_bits) | static_cast<int64_t>(door);
}

void request_admission::release(int count) { num_in_flight_ -= count; }

}  // namespace troupe
