// When `troupe launch` restarts a node that died: the mode, the doubling back-off and its reset,
// and giving up after too many restarts in a window.

#include <gtest/gtest.h>

#include <stdexcept>

#include "node/restart_policy.hpp"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using action = restart_decision::action;
using clock_type = restart_policy::clock;

const clock_type::time_point t0{};  // a fixed origin: the policy only compares time points

TEST(restart_policy, on_failure_restarts_a_crash_and_leaves_a_clean_exit_down) {
  restart_policy p(restart_mode::on_failure);
  const restart_decision crash = p.after_exit(true, 1s, t0);
  EXPECT_EQ(crash.what, action::restart);
  EXPECT_EQ(crash.delay, 500ms);
  const restart_decision clean = p.after_exit(false, 1s, t0 + 2s);
  EXPECT_EQ(clean.what, action::stay_down);
  EXPECT_NE(clean.why.find("exited cleanly"), std::string::npos) << clean.why;
}

TEST(restart_policy, always_restarts_a_clean_exit_too_and_never_restarts_nothing) {
  restart_policy always(restart_mode::always);
  EXPECT_EQ(always.after_exit(false, 1s, t0).what, action::restart);
  restart_policy never(restart_mode::never);
  EXPECT_EQ(never.after_exit(true, 1s, t0).what, action::stay_down);
  EXPECT_EQ(never.after_exit(false, 1s, t0).what, action::stay_down);
}

TEST(restart_policy, back_off_doubles_up_to_its_cap_between_quick_deaths) {
  restart_limits limits;
  limits.first_delay = 500ms;
  limits.max_delay = 3s;
  limits.max_restarts = 100;
  restart_policy p(restart_mode::on_failure, limits);
  std::vector<long> delays;
  for (int i = 0; i < 6; ++i) delays.push_back(p.after_exit(true, 100ms, t0 + i * 1s).delay.count());
  EXPECT_EQ(delays, (std::vector<long>{500, 1000, 2000, 3000, 3000, 3000}));
}

TEST(restart_policy, a_node_that_ran_a_while_starts_its_back_off_over) {
  restart_limits limits;
  limits.stable_after = 60s;
  limits.max_restarts = 100;
  restart_policy p(restart_mode::on_failure, limits);
  p.after_exit(true, 1s, t0);
  p.after_exit(true, 1s, t0 + 2s);
  EXPECT_EQ(p.after_exit(true, 1s, t0 + 5s).delay, 2000ms);
  EXPECT_EQ(p.after_exit(true, 59s, t0 + 70s).delay, 4000ms);  // just short of stable: still doubling
  EXPECT_EQ(p.after_exit(true, 60s, t0 + 140s).delay, 500ms);
}

TEST(restart_policy, gives_up_after_max_restarts_within_the_window_and_says_why) {
  restart_limits limits;
  limits.max_restarts = 3;
  limits.window = 60s;
  restart_policy p(restart_mode::always, limits);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p.after_exit(true, 1s, t0 + i * 10s).what, action::restart) << i;
  const restart_decision d = p.after_exit(true, 1s, t0 + 30s);
  EXPECT_EQ(d.what, action::give_up);
  EXPECT_EQ(d.why, "3 restarts within 60 s");
}

TEST(restart_policy, restarts_older_than_the_window_no_longer_count) {
  restart_limits limits;
  limits.max_restarts = 2;
  limits.window = 60s;
  restart_policy p(restart_mode::on_failure, limits);
  EXPECT_EQ(p.after_exit(true, 1s, t0).what, action::restart);
  EXPECT_EQ(p.after_exit(true, 1s, t0 + 30s).what, action::restart);
  EXPECT_EQ(p.after_exit(true, 1s, t0 + 61s).what, action::restart);  // the first has left the window
  EXPECT_EQ(p.after_exit(true, 1s, t0 + 70s).what, action::give_up);
}

TEST(restart_policy, modes_parse_by_name_and_a_bad_one_is_quoted) {
  EXPECT_EQ(parse_restart_mode("always"), restart_mode::always);
  EXPECT_EQ(parse_restart_mode("on-failure"), restart_mode::on_failure);
  EXPECT_EQ(parse_restart_mode("never"), restart_mode::never);
  EXPECT_EQ(restart_mode_name(restart_mode::on_failure), "on-failure");
  try {
    parse_restart_mode("sometimes");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("\"sometimes\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe
