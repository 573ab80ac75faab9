#pragma once
// Decode steps replayed from CUDA graphs: one graph per batch-size bucket (a power of two; a
// decode batch is padded up to its bucket), captured from a step run on one stream. A graph
// holds the addresses of the buffers it was captured with, so the owner clears them when a
// buffer moves (step_buffers::ensure).

#include <functional>
#include <map>

#include <cuda_runtime.h>

namespace troupe::cuda {

class step_graphs {
 public:
  step_graphs() = default;
  ~step_graphs() { clear(); }
  step_graphs(const step_graphs&) = delete;
  step_graphs& operator=(const step_graphs&) = delete;

  // The bucket a decode batch of `num_seqs` sequences runs in: the next power of two.
  static int bucket(int num_seqs);

  // The graph of `rows`, or null when none was captured.
  cudaGraphExec_t find(int rows) const;
  // Captures what `queue_step` puts on `stream` (and nothing runs) as the graph of `rows`.
  // Throws std::runtime_error when capture or instantiation fails; no graph is kept then.
  void capture(int rows, cudaStream_t stream, const std::function<void()>& queue_step);
  void clear();

 private:
  std::map<int, cudaGraphExec_t> graphs_;  // bucket -> captured step
};

}  // namespace troupe::cuda
