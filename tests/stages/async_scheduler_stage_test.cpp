// The scheduler stage with async_scheduling: two plans out at once, results applied in order,
// a finished or aborted request's extra step ignored, a failed step ending its requests, and
// every block free at the end. The fake worker below plays the model_runner's part: it fills a
// placeholder input from the token it sampled for that request in the step before.

#include <gtest/gtest.h>

#include <deque>
#include <map>

#include "stages/scheduler_stage.hpp"
#include "tests/stages/scheduler_stage_support.hpp"

namespace troupe::test {
namespace {

engine_config async_config() { return small_stage_config(/*async_scheduling=*/true); }

// Samples `input + 1` for each sampled row; a placeholder input is its own previous sample.
class fake_worker {
 public:
  step_done run(const step_plan& plan) {
    step_done done;
    done.result.step_id = plan.step_id;
    std::map<int64_t, int32_t> sampled;
    for (const auto& s : plan.sequences) {
      int32_t input = s.new_token_ids.back();
      if (s.input_from_previous_sample) {
        EXPECT_EQ(input, -1);
        auto it = previous_.find(s.request_id);
        EXPECT_NE(it, previous_.end()) << "request " << s.request_id << " sampled nothing in the step before";
        input = it == previous_.end() ? 0 : it->second;
      }
      if (s.sample) {
        done.result.tokens.push_back(sampled_token{s.request_id, input + 1, 0.0f, {}, {}});
        sampled[s.request_id] = input + 1;
      }
    }
    previous_ = std::move(sampled);
    done.compute_ns = 1;
    return done;
  }

 private:
  std::map<int64_t, int32_t> previous_;
};

void append(std::map<int64_t, std::vector<int32_t>>& tokens, std::map<int64_t, finish_reason>& finishes,
            const scheduler_stage::outputs& out) {
  for (const auto& d : out.tokens.deltas) {
    tokens[d.request_id].insert(tokens[d.request_id].end(), d.token_ids.begin(), d.token_ids.end());
    if (d.finished()) finishes[d.request_id] = d.finish;
  }
}

TEST(async_scheduler_stage, keeps_two_steps_in_flight_and_answers_like_one) {
  scheduler_stage stage(async_config(), {2});
  std::deque<step_plan> sent;
  auto out = stage.add(make_request(1, 6));
  EXPECT_EQ(out.plans.size(), 2u) << "the decode after the prefill is planned at once";
  EXPECT_EQ(stage.num_steps_in_flight(), 2);
  for (auto& p : out.plans) sent.push_back(p);
  EXPECT_TRUE(stage.add(make_request(2, 4)).plans.empty()) << "two steps are in flight already";

  fake_worker worker;
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, finish_reason> finishes;
  for (int steps = 0; !sent.empty() && steps < 50; ++steps) {
    step_plan plan = std::move(sent.front());
    sent.pop_front();
    auto next = stage.step_finished(worker.run(plan));
    EXPECT_LE(stage.num_steps_in_flight(), 2);
    append(tokens, finishes, next);
    for (auto& p : next.plans) sent.push_back(p);
  }
  // The prompt ends with 8: each token is one more than the one before it.
  EXPECT_EQ(tokens[1], (std::vector<int32_t>{9, 10, 11, 12, 13, 14}));
  EXPECT_EQ(tokens[2], (std::vector<int32_t>{9, 10, 11, 12}));
  EXPECT_EQ(finishes[1], finish_reason::length);
  EXPECT_EQ(finishes[2], finish_reason::length);
  auto stats = stage.stats(0);
  EXPECT_EQ(stats.num_free_blocks, 16);
  EXPECT_EQ(stats.num_running, 0);
  EXPECT_FALSE(stage.step_in_flight());
}

TEST(async_scheduler_stage, an_eos_in_step_n_drops_step_n_plus_one_for_that_request) {
  scheduler_stage stage(async_config(), {10});  // the second token (10) is EOS
  auto out = stage.add(make_request(1, 8));
  ASSERT_EQ(out.plans.size(), 2u);
  fake_worker worker;
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, finish_reason> finishes;
  std::deque<step_plan> sent(out.plans.begin(), out.plans.end());
  while (!sent.empty()) {
    step_plan plan = std::move(sent.front());
    sent.pop_front();
    auto next = stage.step_finished(worker.run(plan));
    append(tokens, finishes, next);
    for (auto& p : next.plans) sent.push_back(p);
  }
  EXPECT_EQ(tokens[1], (std::vector<int32_t>{9, 10}));
  EXPECT_EQ(finishes[1], finish_reason::stop);
  EXPECT_EQ(stage.stats(0).num_free_blocks, 16);
}

TEST(async_scheduler_stage, an_abort_between_two_steps_frees_the_blocks_and_ignores_both_results) {
  scheduler_stage stage(async_config(), {2});
  auto out = stage.add(make_request(1, 20));
  ASSERT_EQ(out.plans.size(), 2u);
  auto aborted = stage.abort(1);
  ASSERT_EQ(aborted.tokens.deltas.size(), 1u);
  EXPECT_EQ(aborted.tokens.deltas[0].finish, finish_reason::abort);
  EXPECT_EQ(stage.stats(0).num_free_blocks, 16);
  fake_worker worker;
  auto first = stage.step_finished(worker.run(out.plans[0]));
  EXPECT_TRUE(first.tokens.deltas.empty());
  EXPECT_TRUE(first.plans.empty());
  auto second = stage.step_finished(worker.run(out.plans[1]));
  EXPECT_TRUE(second.tokens.deltas.empty());
  EXPECT_FALSE(stage.step_in_flight());
}

TEST(async_scheduler_stage, a_failed_step_ends_its_requests_and_the_step_after_it_is_ignored) {
  scheduler_stage stage(async_config(), {2});
  auto out = stage.add(make_request(1, 20));
  ASSERT_EQ(out.plans.size(), 2u);
  step_done failed;
  failed.result.step_id = out.plans[0].step_id;
  failed.error = "device lost";
  auto next = stage.step_finished(failed);
  ASSERT_EQ(next.tokens.failures.size(), 1u);
  EXPECT_NE(next.tokens.failures[0].message.find("device lost"), std::string::npos);
  EXPECT_EQ(stage.stats(0).num_free_blocks, 16);
  // The worker cannot fill the second step's placeholder after a failure: it fails as well.
  step_done also_failed;
  also_failed.result.step_id = out.plans[1].step_id;
  also_failed.error = "no previous sample";
  auto after = stage.step_finished(also_failed);
  EXPECT_TRUE(after.tokens.failures.empty()) << "the request was failed once already";
  EXPECT_FALSE(stage.step_in_flight());
}

// The worker answers in plan order, so a reply naming a later step is malformed: dropping it
// would leave the oldest step's requests waiting for an answer that never comes.
TEST(async_scheduler_stage, a_reply_out_of_order_fails_the_oldest_steps_requests) {
  scheduler_stage stage(async_config(), {2});
  auto out = stage.add(make_request(1, 20));
  ASSERT_EQ(out.plans.size(), 2u);
  step_done second;
  second.result.step_id = out.plans[1].step_id;
  second.result.tokens.push_back(sampled_token{1, 10, 0.0f, {}, {}});
  auto failed = stage.step_finished(second);
  EXPECT_TRUE(failed.tokens.deltas.empty());
  ASSERT_EQ(failed.tokens.failures.size(), 1u);
  EXPECT_EQ(failed.tokens.failures[0].request_id, 1);
  EXPECT_NE(failed.tokens.failures[0].message.find("malformed"), std::string::npos);
  EXPECT_EQ(stage.num_steps_in_flight(), 1);
  // The step still out answers for a request that is gone: nothing more comes of it.
  auto rest = stage.step_finished(second);
  EXPECT_TRUE(rest.tokens.empty());
  EXPECT_EQ(stage.num_steps_in_flight(), 0);
  EXPECT_EQ(stage.stats(0).num_free_blocks, async_config().num_kv_blocks);
}

}  // namespace
}  // namespace troupe::test

namespace troupe::test {
namespace {

// Requests arriving at any moment between results, as they do from the tokenizers: every one
// must finish with exactly its max_tokens, and every block must come back.
TEST(async_scheduler_stage, requests_arriving_between_any_two_results_all_finish) {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    engine_config c = async_config();
    c.num_kv_blocks = 256;
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = 64;
    scheduler_stage stage(c, {2});
    fake_worker worker;
    std::deque<step_plan> sent;
    std::map<int64_t, std::vector<int32_t>> tokens;
    std::map<int64_t, finish_reason> finishes;
    uint32_t state = seed;
    auto next_random = [&] { return state = state * 1664525u + 1013904223u; };
    int next_id = 0;
    const int num_requests = 40;
    for (int turn = 0; turn < 5000 && (next_id < num_requests || !sent.empty()); ++turn) {
      scheduler_stage::outputs out;
      if (next_id < num_requests && (sent.empty() || next_random() % 3 == 0)) {
        auto r = make_request(next_id, 1 + static_cast<int>(next_random() % 9));
        r.prompt_ids.assign(1 + next_random() % 20, 5);
        ++next_id;
        out = stage.add(std::move(r));
      } else {
        step_plan plan = std::move(sent.front());
        sent.pop_front();
        out = stage.step_finished(worker.run(plan));
      }
      append(tokens, finishes, out);
      for (auto& p : out.plans) sent.push_back(p);
      ASSERT_LE(stage.num_steps_in_flight(), 2);
    }
    EXPECT_EQ(finishes.size(), static_cast<size_t>(num_requests)) << "seed " << seed;
    for (const auto& [id, f] : finishes) EXPECT_EQ(f, finish_reason::length) << "seed " << seed << " request " << id;
    EXPECT_EQ(stage.stats(0).num_free_blocks, 256) << "seed " << seed;
    EXPECT_FALSE(stage.engine_scheduler().has_unfinished()) << "seed " << seed;
  }
}

}  // namespace
}  // namespace troupe::test
