// 64 concurrent clients with mixed prompt lengths and max_tokens at temperature 0: every output
// equals the same request served alone, nothing is lost, every KV block is free afterwards.
// A tiny KV pool forces preemption, and a prompt longer than the step budget is chunked: both
// give the same outputs again.

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

const std::vector<std::string> prompts = {
    "Once upon a time",
    "Zoo",
    "Lily wanted",
    "The little dog ran to the park and saw a big red ball. He wanted to",
    "Tom and Sam were best friends. One day they found a box in the garden. Inside the box",
    "A",
    "She looked at the sky",
    "Once upon a time, there was a big tree in the forest. The tree was very old and had many birds living in it",
};

std::vector<generate_request> mixed_requests(int count) {
  const int lengths[] = {4, 9, 17, 33, 60};
  std::vector<generate_request> requests;
  for (int i = 0; i < count; ++i) {
    requests.push_back(greedy(prompts[i % prompts.size()], lengths[(i * 7) % 5]));
    requests.back().id = "req-" + std::to_string(i);
  }
  return requests;
}

std::vector<completion> serve_alone(const serve_process& server, const std::vector<generate_request>& requests) {
  client c = server.make_client();
  std::vector<completion> outputs;
  for (const auto& r : requests) outputs.push_back(c.generate(r));
  return outputs;
}

void expect_same(const std::vector<completion>& alone, const std::vector<completion>& together) {
  ASSERT_EQ(alone.size(), together.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    EXPECT_EQ(together[i].token_ids, alone[i].token_ids) << "request " << i;
    EXPECT_EQ(together[i].text, alone[i].text) << "request " << i;
    EXPECT_EQ(together[i].finish_reason, alone[i].finish_reason) << "request " << i;
  }
}

// Every scenario runs with one step in flight and with overlapped scheduling (two in flight):
// the outputs must not depend on it.
class serve_concurrency : public ::testing::TestWithParam<std::string> {
 protected:
  std::vector<std::string> with_mode(std::vector<std::string> args) const {
    args.push_back("--async-scheduling");
    args.push_back(GetParam());
    return args;
  }
};

TEST_P(serve_concurrency, sixty_four_clients_match_serving_alone) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  serve_process server(with_mode({"--max-num-seqs", "64"}));
  auto requests = mixed_requests(64);
  auto alone = serve_alone(server, requests);
  // The reference continuation of "Once upon a time" (README of stories260K, 60 greedy tokens).
  ASSERT_EQ(requests[32].sampling.max_tokens, 60);
  EXPECT_EQ(alone[32].text,
            ", there was a little girl named Lily. She loved to play outside in the park. One day, "
            "she saw a big, red ball. She wanted to play with it, but it was too high.\nLily");
  auto together = serve_together(server, requests);
  expect_same(alone, together);
  for (size_t i = 0; i < together.size(); ++i) {
    EXPECT_EQ(together[i].usage.completion_tokens, static_cast<int>(together[i].token_ids.size()));
    EXPECT_GT(together[i].timings.e2e, 0.0);
    // Each from one clock (docs/protocol.md): queue the scheduler's, inside the door's ttft.
    EXPECT_GE(together[i].timings.queue, 0.0);
    EXPECT_LE(together[i].timings.queue, together[i].timings.ttft);
    EXPECT_LE(together[i].timings.ttft, together[i].timings.e2e);
  }
  client c = server.make_client();
  auto stats = wait_until_idle(c);
  EXPECT_EQ(stats.num_free_blocks, stats.num_total_blocks);
  EXPECT_EQ(stats.num_requests_in_flight, 0);
}

TEST_P(serve_concurrency, a_tiny_kv_pool_preempts_and_gives_the_same_outputs) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  // 12 blocks of 16 tokens: one request of up to ~130 tokens fits alone, 16 at once cannot.
  serve_process server(with_mode({"--num-kv-blocks", "12", "--max-num-seqs", "16"}));
  auto requests = mixed_requests(16);
  for (auto& r : requests) r.sampling.max_tokens = 60;
  auto alone = serve_alone(server, requests);
  auto together = serve_together(server, requests);
  expect_same(alone, together);
  // Each request fits the pool alone; sixteen at once cannot all grow to 60 tokens, so some
  // must have lost their blocks and been recomputed, and the final deltas say so.
  int preempted_alone = 0, preempted_together = 0;
  for (const auto& out : alone) preempted_alone += out.usage.num_preemptions;
  for (const auto& out : together) preempted_together += out.usage.num_preemptions;
  EXPECT_EQ(preempted_alone, 0);
  EXPECT_GT(preempted_together, 0);
  client c = server.make_client();
  auto stats = wait_until_idle(c);
  EXPECT_EQ(stats.num_free_blocks, 12);
  EXPECT_EQ(stats.num_total_blocks, 12);
}

TEST_P(serve_concurrency, a_prompt_longer_than_the_step_budget_completes) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  std::string long_prompt;
  for (int i = 0; i < 12; ++i) long_prompt += "The cat sat on the mat and looked at the sun. ";
  serve_process chunked(with_mode({"--max-num-batched-tokens", "32"}));
  client c = chunked.make_client();
  auto out = c.generate(greedy(long_prompt, 20));
  EXPECT_GT(out.usage.prompt_tokens, 32 * 4);
  EXPECT_EQ(out.usage.completion_tokens, 20);
  EXPECT_EQ(out.finish_reason, "length");
  serve_process whole(with_mode({}));
  client w = whole.make_client();
  EXPECT_EQ(w.generate(greedy(long_prompt, 20)).token_ids, out.token_ids);
}

// --batch-invariant on a float model: the KV cache defaults to f16 (half the bytes; without the
// flag such a model keeps f32, since sgemm's last bits would round apart), and 32 concurrent
// requests, whose prefill steps batch well past 32 rows, answer as each did alone.
TEST_P(serve_concurrency, batch_invariant_float_model_serves_an_f16_cache_with_the_outputs_alone) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  serve_process server(with_mode({"--batch-invariant", "--max-num-seqs", "32"}));
  EXPECT_NE(server.log().find("KV f16"), std::string::npos) << server.log();
  auto requests = mixed_requests(32);
  auto alone = serve_alone(server, requests);
  auto together = serve_together(server, requests);
  expect_same(alone, together);
}

INSTANTIATE_TEST_SUITE_P(async_scheduling, serve_concurrency, ::testing::Values("off", "on"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace troupe::test
