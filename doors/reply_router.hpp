#pragma once
// Sends each reply event to the door its request came through (the door is in the request id,
// see request_admission) and counts what finished requests used, for /metrics. Plain class; the
// frontend actor calls it, one event at a time.

#include <array>
#include <atomic>
#include <cstdint>

#include "doors/door_events.hpp"
#include "doors/request_admission.hpp"

namespace troupe {

// Totals over every finished request of both doors. Read from any thread.
struct serving_counters {
  std::atomic<uint64_t> num_prompt_tokens{0};
  std::atomic<uint64_t> num_generation_tokens{0};
  std::atomic<uint64_t> num_finished_stop{0};
  std::atomic<uint64_t> num_finished_length{0};
  std::atomic<uint64_t> num_finished_abort{0};
  std::atomic<uint64_t> num_failed{0};
};

class reply_router {
 public:
  // A door left unset (nullptr) drops its events: it was not started.
  void set_door(client_door door, door_inbox* inbox) { doors_[static_cast<int>(door)] = inbox; }

  void route(text_batch batch);
  void route(request_failed failed);
  void route(stats_answer stats);

  const serving_counters& counters() const { return counters_; }

 private:
  void count(const text_delta& d);

  std::array<door_inbox*, num_client_doors> doors_{};
  serving_counters counters_;
};

}  // namespace troupe
