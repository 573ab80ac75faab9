// A server that cannot start says why, once, and exits: a door that cannot bind is the reason,
// not the stages it had already started (they stop as at shutdown, not as failed stages).

#include <gtest/gtest.h>

#include <string>

#include "tests/e2e/e2e_support.hpp"

namespace troupe::test {
namespace {

TEST(serve_start_failure, a_door_that_cannot_bind_is_the_one_error_and_the_server_exits) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_root);
  // `timeout` bounds a server that would hang instead of exiting.
  const run_result r =
      run_command("timeout 60 " + shell_quote(troupe_binary.string()) + " serve --model " + shell_quote(stories_dir) +
                  " --threads 1 --http off --zmq-endpoint tcp://999.0.0.1:1 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("cannot bind tcp://999.0.0.1:1"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("stage failed"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace troupe::test
