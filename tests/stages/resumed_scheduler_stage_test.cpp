// The scheduler stage takes a resumed request (schedule_request::resumed_output_ids, sent by
// failover) and continues it as the undisturbed request would have gone on: on the trained
// stories260K model, with one step in flight and with two (async_scheduling), beside a fresh
// request in the same steps. Its deltas carry only the new tokens, its final metrics the
// undisturbed counts, and every block is free at the end.

#include <gtest/gtest.h>

#include <deque>
#include <map>

#include "stages/scheduler_stage.hpp"
#include "tests/shared_models.hpp"
#include "tests/stages/stories_stage_driver.hpp"

namespace troupe::test {
namespace {

constexpr int num_blocks = 48;
constexpr int block_size = 4;

// The stage and runner of stories_stage_driver.hpp; no request may fail.
class stage_on_stories : public stories_stage_driver {
 public:
  explicit stage_on_stories(bool async_scheduling)
      : stories_stage_driver(stories_stage_options{
            .async_scheduling = async_scheduling, .num_blocks = num_blocks, .block_size = block_size}) {}
};

schedule_request story_request(int64_t id, std::vector<int32_t> prompt, std::vector<int32_t> resumed = {}) {
  schedule_request r;
  r.request_id = id;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.8f;
  r.sampling.top_p = 0.9f;
  r.sampling.seed = 77;
  r.sampling.frequency_penalty = 0.5f;
  r.sampling.max_tokens = 20;
  r.sampling.ignore_eos = true;
  r.sampling.stop = {"the end"};
  r.resumed_output_ids = std::move(resumed);
  return r;
}

// Two of stories260K's reference prompts (refs.json).
const std::vector<int32_t> story_prompt = {1, 403, 407, 261, 378};
const std::vector<int32_t> other_prompt = {1, 317, 391, 266};

class resumed_scheduler_stage : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { TROUPE_REQUIRE_SHARED_MODEL(stories260k_dir / "hf" / "config.json"); }
};

TEST_P(resumed_scheduler_stage, continues_the_undisturbed_stream_beside_a_fresh_request) {
  stage_request_outcome undisturbed;
  {
    stage_on_stories alone(GetParam());
    ASSERT_TRUE(alone.add(story_request(1, story_prompt)).empty());
    alone.run();
    undisturbed = alone.outcomes[1];
  }
  ASSERT_EQ(undisturbed.tokens.size(), 20u);
  ASSERT_EQ(undisturbed.finish, finish_reason::length);

  for (size_t k : {size_t{1}, size_t{9}, size_t{19}}) {
    SCOPED_TRACE("resumed after " + std::to_string(k) + " outputs, async_scheduling " + std::to_string(GetParam()));
    stage_on_stories node(GetParam());
    ASSERT_TRUE(node.add(story_request(5, other_prompt)).empty());  // running when the resumed one arrives
    node.step();
    node.step();
    const std::vector<int32_t> resumed(undisturbed.tokens.begin(),
                                       undisturbed.tokens.begin() + static_cast<std::ptrdiff_t>(k));
    ASSERT_TRUE(node.add(story_request(6, story_prompt, resumed)).empty());
    node.run();

    const stage_request_outcome& got = node.outcomes[6];
    EXPECT_EQ(got.tokens, std::vector<int32_t>(undisturbed.tokens.begin() + static_cast<std::ptrdiff_t>(k),
                                               undisturbed.tokens.end()));
    EXPECT_EQ(got.finish, finish_reason::length);
    ASSERT_TRUE(got.metrics.has_value());
    EXPECT_EQ(got.metrics->num_prompt_tokens, undisturbed.metrics->num_prompt_tokens);
    EXPECT_EQ(got.metrics->num_output_tokens, undisturbed.metrics->num_output_tokens);
    // A new node's detokenizer learns the stop strings from the first delta it gets.
    ASSERT_FALSE(got.stops.empty());
    EXPECT_EQ(got.stops.front(), std::vector<std::string>{"the end"});
    EXPECT_EQ(node.outcomes[5].finish, finish_reason::length);
    EXPECT_EQ(node.outcomes[5].tokens.size(), 20u);
    const stats_answer stats = node.stage().stats(0);
    EXPECT_EQ(stats.num_free_blocks, num_blocks);
    EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
  }
}

// Every delta of a run carries the run's number from its schedule_request (the router drops an
// earlier run's deltas by it), the resumed run's and the fresh request's alike.
TEST_P(resumed_scheduler_stage, stamps_every_delta_with_the_run_it_belongs_to) {
  stage_on_stories stage(GetParam());
  schedule_request resumed = story_request(1, story_prompt, {story_prompt[1], story_prompt[2]});
  resumed.attempt = 2;
  ASSERT_TRUE(stage.add(std::move(resumed)).empty());
  ASSERT_TRUE(stage.add(story_request(2, other_prompt)).empty());
  stage.run();
  ASSERT_FALSE(stage.outcomes[1].attempts.empty());
  for (uint32_t attempt : stage.outcomes[1].attempts) EXPECT_EQ(attempt, 2u);
  ASSERT_FALSE(stage.outcomes[2].attempts.empty());
  for (uint32_t attempt : stage.outcomes[2].attempts) EXPECT_EQ(attempt, 0u);
  EXPECT_EQ(stage.outcomes[1].finish, finish_reason::length);
}

TEST_P(resumed_scheduler_stage, refuses_a_resumed_request_that_has_already_finished_and_keeps_serving) {
  stage_on_stories node(GetParam());
  schedule_request finished = story_request(3, story_prompt, std::vector<int32_t>(20, 300));
  const std::vector<request_failed> refusals = node.add(finished);
  ASSERT_EQ(refusals.size(), 1u);
  EXPECT_EQ(refusals[0].request_id, 3);
  EXPECT_EQ(refusals[0].code, error_code::bad_request);
  EXPECT_NE(refusals[0].message.find("20 resumed output tokens already reach max_tokens 20"), std::string::npos)
      << refusals[0].message;
  EXPECT_TRUE(node.add(story_request(3, story_prompt, std::vector<int32_t>(4, 300))).empty());
  node.run();
  EXPECT_EQ(node.outcomes[3].tokens.size(), 16u);
  EXPECT_EQ(node.outcomes[3].finish, finish_reason::length);
  EXPECT_EQ(node.stage().stats(0).num_free_blocks, num_blocks);
}

TEST(resumed_scheduler_stage_abort, an_abort_that_overtakes_a_resumed_request_counts_its_resumed_outputs) {
  // The client's usage must not lose the tokens it already got from the engine that died.
  engine_config config;
  config.block_size = block_size;
  config.num_kv_blocks = num_blocks;
  scheduler_stage stage(config, {2});
  EXPECT_TRUE(stage.abort(9).tokens.deltas.empty());
  scheduler_stage::outputs out = stage.add(story_request(9, story_prompt, {300, 301, 302}));
  ASSERT_EQ(out.tokens.deltas.size(), 1u);
  const token_delta& aborted = out.tokens.deltas[0];
  EXPECT_EQ(aborted.finish, finish_reason::abort);
  EXPECT_TRUE(aborted.token_ids.empty());
  ASSERT_TRUE(aborted.metrics.has_value());
  EXPECT_EQ(aborted.metrics->num_prompt_tokens, 5);
  EXPECT_EQ(aborted.metrics->num_output_tokens, 3);
}

INSTANTIATE_TEST_SUITE_P(scheduling, resumed_scheduler_stage, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? std::string("async") : std::string("sync"); });

}  // namespace
}  // namespace troupe::test
