// A pipeline stage lost under a running engine (issue 27, "Failover"): the scheduler stage puts
// the requests of the failed step, and every other running one, back to be recomputed from their
// tokens instead of failing them; it plans nothing while the stage is down (the process's
// stage_health_board) and runs them again once it is back, each continuing its stream with no
// token lost or repeated (seeded sampling with penalties: the state that must survive). Past the
// failover wait they fail naming the stage. On the trained stories260K model, with one step in
// flight and with two (async_scheduling). No actors: the test passes plans to a model_runner.

#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <map>
#include <thread>

#include "pipeline/stage_health.hpp"
#include "stages/scheduler_stage.hpp"
#include "tests/shared_models.hpp"
#include "tests/stages/stories_stage_driver.hpp"

namespace troupe::test {
namespace {

using namespace std::chrono_literals;

constexpr int num_blocks = 64;
constexpr int block_size = 4;
const std::string lost_stage = "pipeline stage 0-1 at kvtcp://127.0.0.1:1";

// The board says the stage is down for the test's length, and never after it.
class stage_down_on_board {
 public:
  stage_down_on_board() { stage_health_board::instance().down(lost_stage, "down (killed); reconnecting"); }
  ~stage_down_on_board() { up(); }
  void up() { stage_health_board::instance().up(lost_stage); }
};

// The stage and runner of stories_stage_driver.hpp; lose_next(n) answers the next n plans as a
// worker whose pipeline stage was lost (`marked`: step_done::stage_lost; else a failure like any).
class stage_on_stories : public stories_stage_driver {
 public:
  stage_on_stories(bool async_scheduling, std::chrono::milliseconds failover_wait)
      : stories_stage_driver(stories_stage_options{.async_scheduling = async_scheduling,
                                                   .num_blocks = num_blocks,
                                                   .block_size = block_size,
                                                   .pipeline_failover_wait = failover_wait,
                                                   .failures_expected = true}) {}
  void lose_next(int n, bool marked = true) {
    for (int i = 0; i < n; ++i) {
      answer_next([marked](const step_plan& plan, step_done& done) {
        done.result.step_id = plan.step_id;
        done.error = lost_stage + ": the connection was lost";
        done.stage_lost = marked;
      });
    }
  }
};

schedule_request story_request(int64_t id, std::vector<int32_t> prompt) {
  schedule_request r;
  r.request_id = id;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.8f;
  r.sampling.top_p = 0.9f;
  r.sampling.seed = 77 + static_cast<uint64_t>(id);
  r.sampling.frequency_penalty = 0.5f;
  r.sampling.max_tokens = 24;
  r.sampling.ignore_eos = true;
  return r;
}

// Two of stories260K's reference prompts (refs.json) and a third.
const std::vector<int32_t> prompts[] = {{1, 403, 407, 261, 378}, {1, 317, 391, 266}, {1, 403, 407, 261, 378, 317, 391}};

timestamp_ns ms_from_now(int ms) { return steady_now_ns() + static_cast<timestamp_ns>(ms) * 1'000'000; }

class pipeline_failover_scheduler_stage : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { TROUPE_REQUIRE_SHARED_MODEL(stories260k_dir / "hf" / "config.json"); }
};

TEST_P(pipeline_failover_scheduler_stage, requests_of_a_lost_stage_wait_and_continue_their_streams_once_it_is_back) {
  std::map<int64_t, stage_request_outcome> undisturbed;
  {
    stage_on_stories alone(GetParam(), 30s);
    for (int64_t id = 1; id <= 3; ++id) ASSERT_TRUE(alone.add(story_request(id, prompts[id - 1])).empty());
    alone.run();
    undisturbed = alone.outcomes;
  }
  ASSERT_EQ(undisturbed[1].tokens.size(), 24u);

  // Lost after k steps: in the prompts, mid-decode, near the end.
  for (int k : {1, 4, 12, 22}) {
    SCOPED_TRACE("lost after " + std::to_string(k) + " steps, async_scheduling " + std::to_string(GetParam()));
    stage_on_stories node(GetParam(), 30s);
    for (int64_t id = 1; id <= 3; ++id) ASSERT_TRUE(node.add(story_request(id, prompts[id - 1])).empty());
    for (int s = 0; s < k; ++s) node.step();
    std::optional<stage_down_on_board> board;
    board.emplace();
    // The step in flight, and with async scheduling the one planned behind it, fail as lost.
    node.lose_next(static_cast<int>(node.num_plans()));
    for (size_t n = node.num_plans(); n > 0; --n) node.step();
    EXPECT_EQ(node.num_plans(), 0u) << "a step was planned while the stage is down";
    EXPECT_TRUE(node.stage().waiting_for_pipeline());
    const stats_answer held = node.stage().stats(0);
    EXPECT_EQ(held.num_running, 0);
    EXPECT_EQ(held.num_free_blocks, num_blocks) << "the lost KV's blocks are free";
    EXPECT_NE(held.unavailable.find(lost_stage), std::string::npos) << held.unavailable;
    // A new request waits too.
    ASSERT_TRUE(node.add(story_request(4, prompts[0])).empty());
    node.tick(ms_from_now(10));
    EXPECT_EQ(node.num_plans(), 0u) << "a step was planned while the stage is down";

    board->up();
    node.tick(ms_from_now(10));
    EXPECT_GT(node.num_plans(), 0u) << "nothing planned once the stage is back";
    node.run();
    EXPECT_FALSE(node.stage().waiting_for_pipeline());
    for (int64_t id = 1; id <= 3; ++id) {
      const stage_request_outcome& got = node.outcomes[id];
      EXPECT_TRUE(got.failures.empty()) << "request " << id << ": " << got.failures.front().message;
      EXPECT_EQ(got.tokens, undisturbed[id].tokens) << "request " << id;
      EXPECT_EQ(got.finish, finish_reason::length) << "request " << id;
      ASSERT_TRUE(got.metrics.has_value());
      EXPECT_EQ(got.metrics->num_output_tokens, 24);
    }
    EXPECT_EQ(node.outcomes[4].tokens.size(), 24u);
    EXPECT_FALSE(node.preempted_ids_seen.empty()) << "the worker never heard that the requests' KV went";
    const stats_answer stats = node.stage().stats(0);
    EXPECT_EQ(stats.num_free_blocks, num_blocks);
    EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
  }
}

TEST_P(pipeline_failover_scheduler_stage, requests_fail_naming_the_stage_once_they_waited_past_the_failover_wait) {
  stage_on_stories node(GetParam(), 100ms);
  for (int64_t id = 1; id <= 2; ++id) ASSERT_TRUE(node.add(story_request(id, prompts[id - 1])).empty());
  for (int s = 0; s < 3; ++s) node.step();
  stage_down_on_board board;
  node.lose_next(static_cast<int>(node.num_plans()));
  for (size_t n = node.num_plans(); n > 0; --n) node.step();
  EXPECT_TRUE(node.outcomes[1].failures.empty()) << "failed at once instead of waiting";
  std::this_thread::sleep_for(80ms);
  ASSERT_TRUE(node.add(story_request(3, prompts[2])).empty());  // arrives while the stage is down: waits its own 100 ms
  node.tick(ms_from_now(40));                                   // past the first two's wait, not the third's
  for (int64_t id = 1; id <= 2; ++id) {
    const stage_request_outcome& got = node.outcomes[id];
    ASSERT_EQ(got.failures.size(), 1u) << "request " << id;
    EXPECT_EQ(got.failures[0].code, error_code::unavailable);
    EXPECT_NE(got.failures[0].message.find("failover_wait_ms (100 ms)"), std::string::npos) << got.failures[0].message;
    EXPECT_NE(got.failures[0].message.find(lost_stage), std::string::npos) << got.failures[0].message;
  }
  EXPECT_TRUE(node.outcomes[3].failures.empty());
  EXPECT_TRUE(node.stage().waiting_for_pipeline());
  node.tick(ms_from_now(150));
  ASSERT_EQ(node.outcomes[3].failures.size(), 1u);
  EXPECT_FALSE(node.stage().waiting_for_pipeline());
  EXPECT_EQ(node.num_plans(), 0u);
  const stats_answer stats = node.stage().stats(0);
  EXPECT_EQ(stats.num_free_blocks, num_blocks);
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
}

TEST_P(pipeline_failover_scheduler_stage, with_no_failover_wait_or_another_cause_a_failed_step_ends_its_requests) {
  for (const bool marked : {true, false}) {
    SCOPED_TRACE(marked ? "stage lost, failover_wait_ms 0" : "a failure not marked as a lost stage");
    stage_on_stories node(GetParam(), marked ? 0ms : 30s);
    ASSERT_TRUE(node.add(story_request(1, prompts[0])).empty());
    node.step();
    node.lose_next(1, marked);
    node.step();
    ASSERT_EQ(node.outcomes[1].failures.size(), 1u);
    EXPECT_EQ(node.outcomes[1].failures[0].code, error_code::internal);
    EXPECT_NE(node.outcomes[1].failures[0].message.find(lost_stage), std::string::npos);
    EXPECT_FALSE(node.stage().waiting_for_pipeline());
  }
}

INSTANTIATE_TEST_SUITE_P(scheduling, pipeline_failover_scheduler_stage, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? std::string("async") : std::string("sync"); });

}  // namespace
}  // namespace troupe::test
