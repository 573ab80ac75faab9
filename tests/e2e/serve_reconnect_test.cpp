// Clients that come and go must never cost another client its reply. The frontend learns of a
// gone client from ZeroMQ's disconnect event, which names the connection's file descriptor; a
// new client may get that same descriptor before the event is handled. Taken for the new
// client's, the stale event used to abort its request and drop its replies, so it waited forever
// (the 64-clients test's rare hang).

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

TEST(serve_reconnect, new_clients_on_reused_descriptors_get_their_replies) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  serve_process server({"--max-num-seqs", "32"});
  constexpr int num_clients = 32;
  for (int round = 0; round < 8; ++round) {
    {
      // Known to the frontend (each has sent a request), then all gone at once: their
      // descriptors are free for the next clients while their disconnect events queue up.
      std::vector<client> leaving;
      for (int i = 0; i < num_clients; ++i) {
        leaving.push_back(server.make_client());
        leaving.back().stats();
      }
    }
    std::vector<std::string> errors(num_clients);
    std::vector<int> num_tokens(num_clients, 0);
    std::vector<std::thread> threads;
    for (int i = 0; i < num_clients; ++i) {
      threads.emplace_back([&, i] {
        try {
          client c = server.make_client();
          c.set_timeout(std::chrono::seconds(60));  // the bug waits forever; any slowness is not it
          num_tokens[i] = static_cast<int>(c.generate(greedy("Once upon a time", 3)).token_ids.size());
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < num_clients; ++i) {
      EXPECT_EQ(errors[i], "") << "round " << round << ", client " << i;
      EXPECT_EQ(num_tokens[i], 3) << "round " << round << ", client " << i;
    }
  }
  client c = server.make_client();
  auto stats = wait_until_idle(c);
  EXPECT_EQ(stats.num_requests_in_flight, 0);
  EXPECT_EQ(stats.num_free_blocks, stats.num_total_blocks);
}

}  // namespace
}  // namespace troupe::test
