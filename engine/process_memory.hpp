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

// Gives the pages of freed memory back to the kernel now. The serving binaries allocate with
// jemalloc, which keeps freed pages resident for 10 s (its dirty decay) in case they are wanted
// again; after a model loads, the loader's and the repacking's temporaries (GGUF q/k un-permuted,
// then repacked and freed) are not, and would stay in RSS that long. jemalloc's all-arena purge
// when the process has jemalloc (found at run time, so the libraries do not link it), else
// glibc's malloc_trim.
void return_freed_memory();

}  // namespace troupe
