// Stop strings end to end on stories260K's greedy "Once upon a time" reference: `troupe serve`
// (streamed and not, several requests at once, the KV free by the time the final delta arrives)
// and `troupe generate --stop`.

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

const std::filesystem::path refs_path = stories_root / "refs.json";

// The reference greedy continuation of `prompt` (60 tokens, no EOS).
std::string reference_completion(const std::string& prompt) {
  return stories_reference(prompt).at("completion").get<std::string>();
}

// Each case against a server with one step in flight and one with two (overlapped scheduling,
// where the step after the match is already planned when the scheduler hears of it).
class stop_strings_serve : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
    TROUPE_REQUIRE_SHARED_MODEL(refs_path);
    server_ = std::make_unique<serve_process>(std::vector<std::string>{"--async-scheduling", GetParam()});
    reference_ = reference_completion("Once upon a time");
  }

  std::unique_ptr<serve_process> server_;
  std::string reference_;
};

TEST_P(stop_strings_serve, text_ends_before_a_stop_string_from_the_middle_and_the_kv_is_free) {
  client c = server_->make_client();
  c.set_timeout(std::chrono::seconds(60));
  const std::string stop = "play outside";  // spans the tokens " play" and " outside"
  auto r = greedy("Once upon a time", 60);
  r.sampling.stop = {stop};
  std::string streamed;
  int num_finals = 0;
  auto out = c.generate(r, [&](const delta_reply& d) {
    streamed += d.text;
    if (d.finish_reason) ++num_finals;
  });
  const std::string expected = reference_.substr(0, reference_.find(stop));
  EXPECT_EQ(out.text, expected);
  EXPECT_EQ(streamed, expected);
  EXPECT_EQ(num_finals, 1);
  EXPECT_EQ(out.finish_reason, "stop");
  // The ids are those up to "e" (the 21st: " play", " ", "out", "s", "id", "e"), which completed
  // the match; tokens sampled after it never reach the client nor the count.
  const auto ids = stories_reference("Once upon a time").at("generated_ids").get<std::vector<int32_t>>();
  EXPECT_EQ(out.token_ids, std::vector<int32_t>(ids.begin(), ids.begin() + 21));
  EXPECT_EQ(out.usage.completion_tokens, 21);
  EXPECT_EQ(out.usage.prompt_tokens, 5);
  // The scheduler freed the request's blocks before the final delta left the detokenizer: no
  // waiting needed.
  stats_reply s = c.stats();
  EXPECT_EQ(s.num_free_blocks, s.num_total_blocks);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_requests_in_flight, 0);
  // Nothing else arrives for this request.
  EXPECT_FALSE(c.receive(std::chrono::milliseconds(300)));
}

TEST_P(stop_strings_serve, the_earliest_of_several_stop_strings_wins_and_unmatched_ones_change_nothing) {
  client c = server_->make_client();
  c.set_timeout(std::chrono::seconds(60));
  {
    auto r = greedy("Once upon a time", 60);
    r.sampling.stop = {"zebra", "red ball", "Lily."};
    r.stream = false;
    auto out = c.generate(r);
    EXPECT_EQ(out.text, ", there was a little girl named ");
    EXPECT_EQ(out.finish_reason, "stop");
  }
  {
    // "Lily!" never completes: the "Lily" that ends the 60 tokens is held, then released.
    auto r = greedy("Once upon a time", 60);
    r.sampling.stop = {"Lily!", "zebra"};
    auto out = c.generate(r);
    EXPECT_EQ(out.text, reference_);
    EXPECT_EQ(out.finish_reason, "length");
    EXPECT_EQ(out.token_ids.size(), 60u);
  }
  stats_reply s = wait_until_idle(c);
  EXPECT_EQ(s.num_free_blocks, s.num_total_blocks);
}

TEST_P(stop_strings_serve, concurrent_requests_each_stop_at_their_own_string) {
  client c = server_->make_client();
  const std::map<std::string, std::string> stops = {
      {"a", ", there"}, {"b", "girl"}, {"c", "park."}, {"d", "it, but"}, {"e", "high.\nLily"}};
  for (const auto& [id, stop] : stops) {
    auto r = greedy("Once upon a time", 60);
    r.id = id;
    r.sampling.stop = {stop};
    c.send(r);
  }
  std::map<std::string, std::string> text, finish;
  std::map<std::string, int> num_finals;
  while (finish.size() < stops.size()) {
    auto reply = c.receive(std::chrono::seconds(60));
    ASSERT_TRUE(reply) << finish.size() << " of " << stops.size() << " finished";
    auto* d = std::get_if<delta_reply>(&*reply);
    ASSERT_NE(d, nullptr);
    text[d->id] += d->text;
    if (d->finish_reason) {
      finish[d->id] = *d->finish_reason;
      ++num_finals[d->id];
    }
  }
  for (const auto& [id, stop] : stops) {
    EXPECT_EQ(text[id], reference_.substr(0, reference_.find(stop))) << id;
    EXPECT_EQ(finish[id], "stop") << id;
    EXPECT_EQ(num_finals[id], 1) << id;
  }
  EXPECT_FALSE(c.receive(std::chrono::milliseconds(300))) << "a delta after a final one";
  stats_reply s = wait_until_idle(c);
  EXPECT_EQ(s.num_free_blocks, s.num_total_blocks);
  EXPECT_EQ(s.num_requests_in_flight, 0);
}

TEST_P(stop_strings_serve, an_empty_stop_string_is_refused_by_name) {
  client c = server_->make_client();
  c.set_timeout(std::chrono::seconds(20));
  auto r = greedy("Once upon a time", 8);
  r.sampling.stop = {"ok", ""};
  try {
    c.generate(r);
    FAIL() << "an empty stop string was accepted";
  } catch (const client_error& e) {
    EXPECT_EQ(e.code(), error_code::bad_request);
    EXPECT_NE(std::string(e.what()).find("stop[1]"), std::string::npos) << e.what();
  }
}

TEST_P(stop_strings_serve, troupe_complete_takes_stop_strings_too) {
  run_result r = run_troupe("complete --endpoint " + server_->endpoint() +
                            " --prompt 'Once upon a time' --max-tokens 60 --stop 'red ball' --usage");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, reference_.substr(0, reference_.find("red ball")) + "\n");
  EXPECT_NE(r.err.find("finish stop"), std::string::npos) << r.err;
}

INSTANTIATE_TEST_SUITE_P(async_scheduling, stop_strings_serve, ::testing::Values("off", "on"));

TEST(stop_strings_generate, stop_ends_the_printed_text_before_the_match) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  TROUPE_REQUIRE_SHARED_MODEL(refs_path);
  const std::string reference = reference_completion("Once upon a time");
  const std::string base = "generate --model " + shell_quote(stories_dir) +
                           " --prompt 'Once upon a time' --temperature 0 --threads 1 --max-tokens 60";
  run_result r = run_troupe(base + " --stop zebra --stop 'outside in'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, reference.substr(0, reference.find("outside in")));
  EXPECT_NE(r.err.find("finish: stop"), std::string::npos) << r.err;
  // The count is the tokens up to " in", the 22nd, which completed the match (refs.json ids).
  EXPECT_NE(r.err.find("generated tokens: 22,"), std::string::npos) << r.err;

  run_result tail = run_troupe(base + " --stop 'Lily!'");
  ASSERT_EQ(tail.exit_code, 0) << tail.err;
  EXPECT_EQ(tail.out, reference);
  EXPECT_NE(tail.err.find("finish: length"), std::string::npos) << tail.err;

  run_result empty = run_troupe(base + " --stop ''");
  EXPECT_NE(empty.exit_code, 0);
  EXPECT_NE((empty.out + empty.err).find("--stop: stop string 0 is empty"), std::string::npos) << empty.err;
}

}  // namespace
}  // namespace troupe::test
