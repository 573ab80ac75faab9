#include "backends/cuda/step_graphs.hpp"

#include "backends/cuda/cuda_check.hpp"

namespace troupe::cuda {

int step_graphs::bucket(int num_seqs) {
  int bucket = 1;
  while (bucket < num_seqs) bucket *= 2;
  return bucket;
}

cudaGraphExec_t step_graphs::find(int rows) const {
  const auto it = graphs_.find(rows);
  return it == graphs_.end() ? nullptr : it->second;
}

void step_graphs::capture(int rows, cudaStream_t stream, const std::function<void()>& queue_step) {
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  try {
    queue_step();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(status, "cudaGraphInstantiate");
  graphs_.emplace(rows, exec);
}

void step_graphs::clear() {
  for (auto& [rows, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

}  // namespace troupe::cuda
