// The trace log keeps the most recent finished requests, bounded, and reads a window of them.

#include <gtest/gtest.h>

#include "doors/request_trace_log.hpp"

namespace troupe {
namespace {

request_record finished_at(int64_t id, timestamp_ns finish) {
  request_record r;
  r.request_id = id;
  r.finish = finish;
  return r;
}

TEST(request_trace_log, drops_the_oldest_beyond_its_capacity_and_reads_a_window) {
  request_trace_log log(3);
  for (int64_t i = 1; i <= 5; ++i) log.add(finished_at(i, i * 100));
  std::vector<request_record> all = log.finished_since(0);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all.front().request_id, 3);
  EXPECT_EQ(all.back().request_id, 5);
  std::vector<request_record> recent = log.finished_since(400);
  ASSERT_EQ(recent.size(), 2u);
  EXPECT_EQ(recent.front().request_id, 4);
  EXPECT_TRUE(log.finished_since(501).empty());
}

}  // namespace
}  // namespace troupe
