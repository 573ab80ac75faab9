#pragma once
// The clock every stage of a node stamps a request with (arrival, tokenized, step begin and end):
// nanoseconds of std::chrono::steady_clock, so stamps taken by different stages subtract.

#include <chrono>
#include <cstdint>

namespace troupe {

using timestamp_ns = int64_t;

inline timestamp_ns steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace troupe
