#include "backends/cpu/thread_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

namespace troupe::cpu {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// How long a worker polls for the next job before it sleeps. Long enough to bridge the gap
// between two ops of one forward step, short enough not to steal a shared core for long.
constexpr int spin_iterations = 4000;

}  // namespace

int hardware_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

thread_pool::thread_pool(int num_threads) {
  num_threads_ = num_threads > 0 ? num_threads : hardware_threads();
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

thread_pool::~thread_pool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void thread_pool::run_chunks(int thread_index) {
  const int64_t num_chunks = (end_ - begin_ + chunk_ - 1) / chunk_;
  for (;;) {
    int64_t chunk = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (chunk >= num_chunks) break;
    int64_t b = begin_ + chunk * chunk_;
    int64_t e = std::min(end_, b + chunk_);
    try {
      (*fn_)(b, e, thread_index);
    } catch (...) {
      bool expected = false;
      if (has_error_.compare_exchange_strong(expected, true)) error_ = std::current_exception();
    }
  }
}

void thread_pool::worker_loop(int thread_index) {
  // The name engine/process_cpu.hpp counts as the model's compute (and `top -H` shows).
  pthread_setname_np(pthread_self(), "troupe-compute");
  uint32_t seen = 0;
  for (;;) {
    uint32_t now = generation_.load(std::memory_order_acquire);
    for (int i = 0; now == seen && i < spin_iterations; ++i) {
      cpu_relax();
      now = generation_.load(std::memory_order_acquire);
    }
    if (now == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = now;
    if (stop_.load()) return;
    run_chunks(thread_index);
    if (num_busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) num_busy_.notify_one();
  }
}

void thread_pool::parallel_for(int64_t begin, int64_t end, int64_t grain, const range_fn& fn) {
  if (end <= begin) return;
  // About one chunk per thread, never below the grain.
  const int64_t per_thread = (end - begin + num_threads_ - 1) / num_threads_;
  run(begin, end, std::max<int64_t>({1, grain, per_thread}), fn);
}

void thread_pool::parallel_for_dynamic(int64_t begin, int64_t end, int64_t chunk, const range_fn& fn) {
  if (end <= begin) return;
  run(begin, end, std::max<int64_t>(1, chunk), fn);
}

void thread_pool::run(int64_t begin, int64_t end, int64_t chunk, const range_fn& fn) {
  if (num_threads_ == 1 || chunk >= end - begin) {
    for (int64_t b = begin; b < end; b += chunk) fn(b, std::min(end, b + chunk), 0);
    return;
  }
  fn_ = &fn;
  begin_ = begin;
  end_ = end;
  chunk_ = chunk;
  next_chunk_.store(0, std::memory_order_relaxed);
  has_error_.store(false, std::memory_order_relaxed);
  error_ = nullptr;
  num_busy_.store(num_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  run_chunks(0);
  // Spin for the stragglers, then sleep: on an oversubscribed machine a worker may be off its
  // core, and spinning would only keep it off longer.
  for (int i = 0; i < spin_iterations; ++i) {
    if (num_busy_.load(std::memory_order_acquire) == 0) break;
    cpu_relax();
  }
  for (int busy = num_busy_.load(std::memory_order_acquire); busy != 0;
       busy = num_busy_.load(std::memory_order_acquire)) {
    num_busy_.wait(busy, std::memory_order_acquire);
  }
  fn_ = nullptr;
  if (has_error_.load()) std::rethrow_exception(error_);
}

}  // namespace troupe::cpu
