// The client plane under abuse: 1,000 malformed frames interleaved with valid requests each get
// an error naming the problem, every valid request completes and the server stays up. Also the
// API key, explicit abort and a client that disconnects mid-stream.

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>

#include <msgpack.hpp>

#include "protocol/codec.hpp"
#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

using packer = msgpack::packer<msgpack::sbuffer>;

// A malformed frame and a word its error message must contain.
struct bad_frame {
  std::string bytes;
  std::string expect;
};

bad_frame make_bad(int i, std::mt19937& rng) {
  msgpack::sbuffer b;
  packer p(b);
  const std::string id = "bad-" + std::to_string(i);
  auto head = [&](int n) {
    p.pack_map(n + 1);
    p.pack(std::string("api_key"));
    p.pack(std::string("secret"));
    p.pack(std::string("type"));
    p.pack(std::string("generate"));
    p.pack(std::string("id"));
    p.pack(id);
  };
  switch (i % 8) {
    case 0: {  // random bytes
      std::string s(1 + rng() % 40, '\0');
      for (auto& ch : s) ch = static_cast<char>(rng());
      s[0] = '\xc1';  // never valid msgpack
      return {s, "malformed msgpack"};
    }
    case 1:
      head(3);
      p.pack(std::string("prompt"));
      p.pack(42);
      return {{b.data(), b.size()}, "'prompt'"};
    case 2:
      head(4);
      p.pack(std::string("prompt"));
      p.pack(std::string("x"));
      p.pack(std::string("max_tokens"));
      p.pack(-3);
      return {{b.data(), b.size()}, "'max_tokens'"};
    case 3:
      head(4);
      p.pack(std::string("prompt"));
      p.pack(std::string("x"));
      p.pack(std::string("colour"));
      p.pack(1);
      return {{b.data(), b.size()}, "unknown field 'colour'"};
    case 4:
      head(3);
      p.pack(std::string("prompt"));
      p.pack(std::string(""));
      return {{b.data(), b.size()}, "'prompt': is empty"};
    case 5:
      head(4);
      p.pack(std::string("prompt"));
      p.pack(std::string("x"));
      p.pack(std::string("max_tokens"));
      p.pack(uint64_t(1) << 62);
      return {{b.data(), b.size()}, "'max_tokens'"};
    case 6: {  // a prompt longer than the context (512 for stories260K)
      head(3);
      p.pack(std::string("prompt_token_ids"));
      p.pack(std::vector<int>(600, 300));
      return {{b.data(), b.size()}, "context"};
    }
    default:
      p.pack_array(2);
      p.pack(1);
      p.pack(2);
      return {{b.data(), b.size()}, "expected a map"};
  }
}

TEST(serve_protocol, malformed_frames_get_errors_and_valid_requests_complete) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  serve_process server({}, "secret");
  client c = server.make_client();
  c.set_timeout(std::chrono::seconds(20));
  std::mt19937 rng(7);
  std::map<std::string, std::string> expected_by_id;  // bad requests with a readable id
  std::vector<std::string> expected_anonymous;        // their id cannot be read
  int num_valid = 0;
  for (int i = 0; i < 1000; ++i) {
    auto bad = make_bad(i, rng);
    c.send_raw(bad.bytes);
    if (i % 8 == 0 || i % 8 == 7) {
      expected_anonymous.push_back(bad.expect);
    } else {
      expected_by_id["bad-" + std::to_string(i)] = bad.expect;
    }
    if (i % 20 == 0) {
      auto r = greedy("Once upon a time", 8);
      r.id = "good-" + std::to_string(num_valid++);
      c.send(r);
    }
  }
  // A valid request without the key is refused.
  msgpack::sbuffer b;
  packer p(b);
  p.pack_map(3);
  p.pack(std::string("type"));
  p.pack(std::string("generate"));
  p.pack(std::string("id"));
  p.pack(std::string("nokey"));
  p.pack(std::string("prompt"));
  p.pack(std::string("hi"));
  c.send_raw(std::string(b.data(), b.size()));
  expected_by_id["nokey"] = "api_key";

  std::map<std::string, std::string> good_text;
  int num_good_done = 0, num_anonymous = 0;
  std::map<std::string, int> num_errors_by_id;
  while (num_good_done < num_valid || num_anonymous < int(expected_anonymous.size()) ||
         num_errors_by_id.size() < expected_by_id.size()) {
    auto reply = c.receive(std::chrono::seconds(20));
    ASSERT_TRUE(reply) << "timed out: " << num_good_done << " good, " << num_anonymous << " anonymous, "
                       << num_errors_by_id.size() << " errors with ids";
    if (auto* e = std::get_if<error_reply>(&*reply)) {
      if (e->id.empty()) {
        ASSERT_LT(num_anonymous, int(expected_anonymous.size()));
        EXPECT_NE(e->message.find(expected_anonymous[num_anonymous]), std::string::npos) << e->message;
        ++num_anonymous;
      } else {
        ASSERT_TRUE(expected_by_id.count(e->id)) << "unexpected error for " << e->id << ": " << e->message;
        EXPECT_NE(e->message.find(expected_by_id[e->id]), std::string::npos) << e->id << ": " << e->message;
        EXPECT_EQ(++num_errors_by_id[e->id], 1);
      }
    } else if (auto* d = std::get_if<delta_reply>(&*reply)) {
      good_text[d->id] += d->text;
      if (d->finish_reason) ++num_good_done;
    }
  }
  EXPECT_EQ(num_good_done, num_valid);
  for (const auto& [id, text] : good_text) EXPECT_EQ(text, ", there was a little girl") << id;  // 8 greedy tokens
  EXPECT_TRUE(server.alive());
  auto stats = wait_until_idle(c);
  EXPECT_EQ(stats.num_free_blocks, stats.num_total_blocks);
}

// With one step in flight ("off") and with two ("on": an aborted request may still be in the
// step after the one that returns, whose result must then be ignored).
class serve_abort : public ::testing::TestWithParam<std::string> {};

TEST_P(serve_abort, explicit_abort_and_client_gone_free_the_kv) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  serve_process server({"--max-model-len", "512", "--async-scheduling", GetParam()});
  client watcher = server.make_client();
  const int total = watcher.stats().num_total_blocks;
  {
    // Explicit abort: the stream ends with finish_reason "abort".
    client c = server.make_client();
    auto r = greedy("Once upon a time", 400);
    r.sampling.ignore_eos = true;
    r.id = "long";
    int deltas = 0;
    auto out = c.generate(r, [&](const delta_reply&) {
      if (++deltas == 3) c.abort("long");
    });
    EXPECT_EQ(out.finish_reason, "abort");
    EXPECT_LT(out.token_ids.size(), 400u);
  }
  {
    // The client vanishes mid-stream: the server notices and frees the request's blocks.
    client c = server.make_client();
    auto r = greedy("Once upon a time", 500);
    r.sampling.ignore_eos = true;
    r.id = "gone";
    c.send(r);
    auto first = c.receive(std::chrono::seconds(5));
    ASSERT_TRUE(first);
    auto busy = watcher.stats();
    EXPECT_EQ(busy.num_running, 1);
    EXPECT_LT(busy.num_free_blocks, total);
  }  // the DEALER closes here
  auto stats = wait_until_idle(watcher, std::chrono::seconds(2));
  EXPECT_EQ(stats.num_running, 0);
  EXPECT_EQ(stats.num_free_blocks, total);
  EXPECT_EQ(stats.num_requests_in_flight, 0);
}

INSTANTIATE_TEST_SUITE_P(async_scheduling, serve_abort, ::testing::Values("off", "on"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace troupe::test
