// The shipped clients against a real server: examples/python/client.py (Debian's pyzmq and
// msgpack) and `troupe complete` both stream the reference greedy continuation.

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

// The first 60 greedy tokens after "Once upon a time" (stories260K README).
const std::string reference =
    ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw "
    "a big, red ball. She wanted to play with it, but it was too high.\nLily";

std::string run(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return out;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) out.append(buffer.data(), n);
  ::pclose(pipe);
  return out;
}

TEST(serve_clients, python_example_and_troupe_complete_stream_the_reference) {
  if (!std::filesystem::exists(stories_dir)) GTEST_SKIP() << "no " << stories_dir;
  serve_process server({}, "k3y");
  std::string python = run("/usr/bin/python3 " TROUPE_SOURCE_DIR "/examples/python/client.py --endpoint " +
                           server.endpoint() + " --api-key k3y --prompt 'Once upon a time' --max-tokens 60 2>/dev/null");
  EXPECT_EQ(python, reference + "\n");
  std::string complete = run(TROUPE_BINARY_DIR "/bin/troupe complete --endpoint " + server.endpoint() +
                             " --api-key k3y --prompt 'Once upon a time' --max-tokens 60");
  EXPECT_EQ(complete, reference + "\n");
  // Without the key the server refuses, and the CLI says why.
  std::string refused = run(TROUPE_BINARY_DIR "/bin/troupe complete --endpoint " + server.endpoint() +
                            " --prompt hi 2>&1");
  EXPECT_NE(refused.find("unauthorized"), std::string::npos) << refused;
}

}  // namespace
}  // namespace troupe::test
