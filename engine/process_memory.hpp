#pragma once
// This process's memory as the kernel counts it (/proc/self/status), for the load log and the
// memory bound of issue 21: a served model's RSS is its weights + its KV pool + a fixed overhead
// (docs/benchmarks.md, "Memory after load").

#include <cstddef>

namespace troupe {

struct process_memory {
  size_t resident_bytes = 0;  // VmRSS: resident now
  size_t peak_bytes = 0;      // VmHWM: the most ever resident
};

// Zeros where /proc is not there to read.
process_memory current_process_memory();

}  // namespace troupe
