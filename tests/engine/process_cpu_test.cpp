// The split of this process's CPU into the model's compute and the serving stack that /metrics
// reports and `troupe plan --cores` charges: a step's CPU added by the worker and every thread
// named as the CPU backend names its pool count as compute; the rest is the stack's.

#include "engine/process_cpu.hpp"

#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace troupe {
namespace {

// Spins on this thread until it has used `seconds` of its own CPU.
void burn_cpu(double seconds) {
  const int64_t until = thread_cpu_ns() + static_cast<int64_t>(seconds * 1e9);
  std::atomic<uint64_t> sink{0};
  while (thread_cpu_ns() < until) sink.fetch_add(1, std::memory_order_relaxed);
}

TEST(process_cpu, a_step_added_by_the_worker_counts_as_compute) {
  const process_cpu_time before = current_process_cpu();
  add_step_cpu_ns(250'000'000);
  const process_cpu_time after = current_process_cpu();
  EXPECT_NEAR(after.compute_s - before.compute_s, 0.25, 1e-6);
  add_step_cpu_ns(-5);  // nothing: a clock read out of order adds no negative time
  EXPECT_NEAR(current_process_cpu().compute_s - after.compute_s, 0, 0.05);
}

TEST(process_cpu, the_compute_pools_threads_count_as_compute_and_other_threads_as_the_stack) {
  // Read while the pool thread lives: /proc lists live threads (a pool lives as long as its model).
  const process_cpu_time before = current_process_cpu();
  std::atomic<bool> stop{false};
  std::atomic<bool> burned{false};
  std::thread live_pool_thread([&] {
    pthread_setname_np(pthread_self(), compute_thread_name);
    burn_cpu(0.15);
    burned = true;
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  std::thread stack_thread([] { burn_cpu(0.15); });
  stack_thread.join();
  while (!burned) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const process_cpu_time after = current_process_cpu();
  stop = true;
  live_pool_thread.join();
  // The kernel's per-thread counts tick at 100 Hz: a margin of a few ticks.
  EXPECT_GE(after.compute_s - before.compute_s, 0.15 - 0.03);
  EXPECT_LE(after.compute_s - before.compute_s, 0.15 + 0.03);
  // The whole process used both threads' time; the stack the other thread's.
  EXPECT_GE(after.total_s - before.total_s, 0.30 - 0.03);
  EXPECT_GE((after.total_s - after.compute_s) - (before.total_s - before.compute_s), 0.15 - 0.03);
}

TEST(process_cpu, what_was_spent_before_serving_began_is_left_out) {
  burn_cpu(0.05);
  mark_serving_began();
  const process_cpu_time serving = process_cpu_while_serving();
  EXPECT_LT(serving.total_s, 0.02);
  burn_cpu(0.05);
  EXPECT_GE(process_cpu_while_serving().total_s, 0.05);
  // A later mark (a worker loaded afterwards) moves nothing: the counters never go back.
  mark_serving_began();
  EXPECT_GE(process_cpu_while_serving().total_s, 0.05);
}

}  // namespace
}  // namespace troupe
