#pragma once
// A persistent pool of worker threads for the CPU backend's ops. One parallel_for at a time:
// the caller takes part in the work and returns when every chunk is done. Workers spin briefly
// between calls (a model step issues hundreds of back-to-back parallel_for calls) and then sleep
// on a futex, so an idle pool costs no CPU.

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace troupe::cpu {

class thread_pool {
 public:
  // The body of a parallel_for: handles indices [begin, end) on thread `thread_index`
  // (0 = the caller, 1..num_threads-1 = workers), e.g. to pick per-thread scratch.
  using range_fn = std::function<void(int64_t begin, int64_t end, int thread_index)>;

  // num_threads <= 0 means one per hardware thread. num_threads counts the caller.
  explicit thread_pool(int num_threads = 0);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int num_threads() const { return num_threads_; }

  // Splits [begin, end) into chunks of at least `grain` indices (about one per thread unless
  // grain asks for smaller ones, which are then handed out dynamically) and runs `fn` on them.
  // Exceptions thrown by `fn` are rethrown here (the first one).
  void parallel_for(int64_t begin, int64_t end, int64_t grain, const range_fn& fn);

  // Hands out chunks of exactly `chunk` indices to whichever thread is free: for work items of
  // uneven cost (attention tiles of a causal prompt).
  void parallel_for_dynamic(int64_t begin, int64_t end, int64_t chunk, const range_fn& fn);

 private:
  void run(int64_t begin, int64_t end, int64_t chunk, const range_fn& fn);
  void worker_loop(int thread_index);
  void run_chunks(int thread_index);

  int num_threads_ = 1;
  std::vector<std::thread> workers_;

  // The current job; written by the caller before `generation_` is bumped.
  const range_fn* fn_ = nullptr;
  int64_t begin_ = 0;
  int64_t end_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int> num_busy_{0};
  std::atomic<uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;
  std::atomic<bool> has_error_{false};
};

// Hardware threads this process may use (at least 1).
int hardware_threads();

}  // namespace troupe::cpu
