#pragma once
// What the client doors (ZeroMQ, HTTP) share before a request enters the stages: one space of
// request ids, so replies can be routed back to the door a request came through, and one bound
// on requests in flight, so neither door can starve the other's clients or the scheduler's queue.
//
// A request id carries its door in its low bits: the node routes every reply event by id alone,
// with no table to keep in step. Its high bits carry the controller's instance id, so ids made by
// two controllers sending to the same stages never collide:
//
//   bit 63: 0 (ids stay positive) | 62..48: controller id | 47..1: sequence | 0: door

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace troupe {

enum class client_door : uint8_t { zmq = 0, http = 1 };
inline constexpr int num_client_doors = 2;
inline constexpr const char* client_door_name(client_door door) { return door == client_door::zmq ? "zmq" : "http"; }

class request_admission {
 public:
  static constexpr int controller_id_bits = 15;
  static constexpr uint32_t max_controller_id = (uint32_t(1) << controller_id_bits) - 1;

  // `controller_id` (at most max_controller_id) tells this controller's ids from another's; by
  // default one drawn at random, which two controllers share with a chance of 1 in 32768.
  explicit request_admission(int64_t max_in_flight, uint32_t controller_id = random_controller_id());
  static uint32_t random_controller_id();

  // Reserves `count` slots at once (all or none, so an n-choice request is never half admitted)
  // and returns the first of `count` consecutive ids of `door`; nullopt when the slots would
  // exceed the bound. Thread-safe.
  std::optional<int64_t> admit(client_door door, int count = 1);
  // Returns the slot of one finished, failed or refused request. Thread-safe.
  void release(int count = 1);

  // Closes admission for good (a drain: the server is stopping): each door then refuses every new
  // request with `reason` (HTTP 503 with Retry-After, the ZeroMQ code `unavailable`) before it
  // asks admit(); requests already admitted run on. The first reason stays. Thread-safe.
  void close(const std::string& reason);
  // The reason admission was closed with; nullopt while it is open. Thread-safe.
  std::optional<std::string> closed_reason() const;

  // The i-th id after `first` of the same door.
  static int64_t nth_id(int64_t first, int i) { return first + (static_cast<int64_t>(i) << door_bits); }
  static uint32_t controller_of(int64_t request_id) {
    return static_cast<uint32_t>(request_id >> (door_bits + sequence_bits)) & max_controller_id;
  }
  uint32_t controller_id() const { return controller_id_; }
  static client_door door_of(int64_t request_id) {
    return static_cast<client_door>(request_id & ((int64_t(1) << door_bits) - 1));
  }
  // A stats tag carries its door the same way.
  uint64_t next_stats_tag(client_door door) {
    return (next_tag_.fetch_add(1) << door_bits) | static_cast<uint64_t>(door);
  }
  static client_door door_of_tag(uint64_t tag) {
    return static_cast<client_door>(tag & ((uint64_t(1) << door_bits) - 1));
  }

  int64_t num_in_flight() const { return num_in_flight_.load(); }
  int64_t max_in_flight() const { return max_in_flight_.load(); }
  // Raises the bound by `more` slots (an engine instance was added while serving). Thread-safe.
  void grow(int64_t more) { max_in_flight_.fetch_add(more); }
  uint64_t num_admitted(client_door door) const { return num_admitted_[static_cast<int>(door)].load(); }
  uint64_t num_refused(client_door door) const { return num_refused_[static_cast<int>(door)].load(); }

 private:
  static constexpr int door_bits = 1;                                        // enough for num_client_doors
  static constexpr int sequence_bits = 63 - controller_id_bits - door_bits;  // 47: 1.4e14 ids

  std::atomic<int64_t> max_in_flight_;
  const uint32_t controller_id_;
  std::atomic<int64_t> num_in_flight_{0};
  std::atomic<int64_t> next_sequence_{1};
  std::atomic<uint64_t> next_tag_{1};
  std::array<std::atomic<uint64_t>, num_client_doors> num_admitted_{};
  std::array<std::atomic<uint64_t>, num_client_doors> num_refused_{};
  std::atomic<bool> closed_{false};  // read on every request; the reason only once set
  mutable std::mutex closed_mutex_;
  std::string closed_reason_;  // guarded by closed_mutex_
};

}  // namespace troupe
