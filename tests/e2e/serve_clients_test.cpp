// The shipped clients against a real server: examples/python/client.py (Debian's pyzmq and
// msgpack) and `troupe complete` both stream the reference greedy continuation.

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

TEST(serve_clients, python_example_and_troupe_complete_stream_the_reference) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
  // The first 60 greedy tokens after "Once upon a time".
  const std::string reference = stories_reference("Once upon a time").at("completion").get<std::string>();
  serve_process server({}, "k3y");
  const run_result python =
      run_command("/usr/bin/python3 " TROUPE_SOURCE_DIR "/examples/python/client.py --endpoint " + server.endpoint() +
                  " --api-key k3y --prompt 'Once upon a time' --max-tokens 60");
  EXPECT_EQ(python.out, reference + "\n") << python.err;
  const run_result complete = run_troupe("complete --endpoint " + server.endpoint() +
                                         " --api-key k3y --prompt 'Once upon a time' --max-tokens 60");
  EXPECT_EQ(complete.out, reference + "\n") << complete.err;
  // Without the key the server refuses, and the CLI says why.
  const run_result refused = run_troupe("complete --endpoint " + server.endpoint() + " --prompt hi");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE((refused.out + refused.err).find("unauthorized"), std::string::npos) << refused.out << refused.err;
}

}  // namespace
}  // namespace troupe::test
