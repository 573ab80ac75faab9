// Refusals are logged at a bounded rate: a flood becomes one line and one summary per window.

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "net/refusal_log.hpp"

namespace troupe {
namespace {

TEST(refusal_log, a_flood_in_one_window_is_one_line) {
  refusal_log log("test port", std::chrono::seconds(60));
  for (int i = 0; i < 5000; ++i) log.refuse("no handshake", "no handshake from 127.0.0.1:" + std::to_string(i));
  EXPECT_EQ(log.num_refused(), 5000u);
  EXPECT_EQ(log.num_lines(), 1u);
  log.flush();  // the window has not passed: nothing more
  EXPECT_EQ(log.num_lines(), 1u);
}

TEST(refusal_log, the_held_refusals_are_summed_once_the_window_passes) {
  refusal_log log("test port", std::chrono::milliseconds(50));
  for (int i = 0; i < 100; ++i) log.refuse("a", "a");
  for (int i = 0; i < 100; ++i) log.refuse("b", "b");
  EXPECT_EQ(log.num_lines(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  log.flush();
  EXPECT_EQ(log.num_lines(), 2u);  // the summary of 199 held
  // A steady flood: one line per window, not one per refusal.
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  int num_refusals = 0;
  while (std::chrono::steady_clock::now() < end) {
    log.refuse("c", "c");
    ++num_refusals;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  log.flush();
  EXPECT_GT(num_refusals, 100);
  EXPECT_LE(log.num_lines(), 2u + 8u);
  EXPECT_EQ(log.num_refused(), 200u + num_refusals);
}

TEST(refusal_log, a_quiet_listener_logs_each_rare_refusal) {
  refusal_log log("test port", std::chrono::milliseconds(20));
  for (int i = 0; i < 3; ++i) {
    log.refuse("a", "a");
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    log.flush();
  }
  EXPECT_EQ(log.num_lines(), 3u);
}

}  // namespace
}  // namespace troupe
