// The graceful drain's course (node/drain_plan.hpp), step by step on a made-up clock.

#include <gtest/gtest.h>

#include <stdexcept>

#include "node/drain_plan.hpp"
#include "node/topology.hpp"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using action = drain_plan::action;
using phase = drain_plan::phase;
const drain_plan::clock::time_point t0{};

TEST(drain_plan, waits_for_running_requests_and_stops_once_none_is_left) {
  drain_plan plan(30s, 5s);
  EXPECT_EQ(plan.next(t0, 3, false), action::wait);  // not begun: serving
  EXPECT_EQ(plan.current(), phase::serving);
  plan.begin(t0);
  EXPECT_EQ(plan.current(), phase::draining);
  EXPECT_EQ(plan.next(t0 + 1s, 3, false), action::wait);
  EXPECT_EQ(plan.next(t0 + 29s, 1, false), action::wait);
  EXPECT_EQ(plan.next(t0 + 29500ms, 0, false), action::stop);
  EXPECT_EQ(plan.current(), phase::stopped);
  EXPECT_TRUE(plan.end_reason().empty());  // nobody was ended
}

TEST(drain_plan, ends_the_rest_at_the_timeout_then_stops_once_their_errors_are_out) {
  drain_plan plan(2s, 5s);
  plan.begin(t0);
  EXPECT_EQ(plan.next(t0 + 1999ms, 4, false), action::wait);
  EXPECT_EQ(plan.next(t0 + 2s, 4, false), action::end_the_rest);
  EXPECT_EQ(plan.current(), phase::ending);
  EXPECT_NE(plan.end_reason().find("drain timeout of 2 s"), std::string::npos) << plan.end_reason();
  EXPECT_EQ(plan.next(t0 + 2100ms, 2, false), action::wait);  // the doors are writing the errors
  EXPECT_EQ(plan.next(t0 + 2200ms, 0, false), action::stop);
}

TEST(drain_plan, a_door_that_never_empties_is_stopped_at_the_flush_limit) {
  drain_plan plan(1s, 3s);
  plan.begin(t0);
  EXPECT_EQ(plan.next(t0 + 1s, 1, false), action::end_the_rest);
  EXPECT_EQ(plan.next(t0 + 3999ms, 1, false), action::wait);
  EXPECT_EQ(plan.next(t0 + 4s, 1, false), action::stop);
}

TEST(drain_plan, a_second_signal_ends_the_drain_at_once) {
  drain_plan plan(30s, 5s);
  plan.begin(t0);
  EXPECT_EQ(plan.next(t0 + 1s, 2, true), action::end_the_rest);
  EXPECT_NE(plan.end_reason().find("second signal"), std::string::npos) << plan.end_reason();
  // A third one while the errors go out changes nothing: they are still written, within the limit.
  EXPECT_EQ(plan.next(t0 + 1100ms, 2, true), action::wait);
  EXPECT_EQ(plan.next(t0 + 1200ms, 0, false), action::stop);
}

TEST(drain_plan, a_zero_timeout_ends_running_requests_at_the_first_look) {
  drain_plan plan(0s, 5s);
  plan.begin(t0);
  EXPECT_EQ(plan.next(t0, 1, false), action::end_the_rest);
  drain_plan idle(0s, 5s);
  idle.begin(t0);
  EXPECT_EQ(idle.next(t0, 0, false), action::stop);  // nothing running: nothing to end
}

TEST(drain_plan, begin_twice_keeps_the_first_deadline_and_the_refusal_names_the_drain) {
  drain_plan plan(2s, 1s);
  plan.begin(t0);
  plan.begin(t0 + 10s);
  EXPECT_EQ(plan.next(t0 + 2s, 1, false), action::end_the_rest);
  EXPECT_NE(plan.refusal().find("draining"), std::string::npos);
  EXPECT_THROW(drain_plan(-1s, 1s), std::invalid_argument);
}

TEST(drain_plan, the_topology_reads_and_checks_the_drain_and_log_settings) {
  topology t = parse_topology("[frontend]\ndrain_timeout_s = 7\naccess_log = false\nlog_stats_interval_s = 0\n");
  EXPECT_EQ(t.drain_timeout_s, 7);
  EXPECT_FALSE(t.access_log);
  EXPECT_EQ(t.log_stats_interval_s, 0);
  topology defaults;
  EXPECT_EQ(defaults.drain_timeout_s, 30);
  EXPECT_TRUE(defaults.access_log);
  EXPECT_EQ(defaults.log_stats_interval_s, 10);
  for (const char* bad : {"[frontend]\ndrain_timeout_s = -1\n", "[frontend]\ndrain_timeout_s = 3601\n",
                          "[frontend]\nlog_stats_interval_s = -5\n"}) {
    try {
      parse_topology(bad).validate();
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("[frontend]"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace troupe
