#pragma once
// The clock a stage times its own work with: nanoseconds of std::chrono::steady_clock. A stamp
// means something only to the process that took it (stages may run on different hosts), so
// stamps never travel in messages: a stage subtracts two of its own and sends the duration.

#include <chrono>
#include <cstdint>

namespace troupe {

using timestamp_ns = int64_t;  // a reading of this process's steady clock
using duration_ns = int64_t;   // the difference of two readings of one clock

inline timestamp_ns steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace troupe
