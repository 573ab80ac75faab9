// scheduler::update refuses a malformed step result whole: nothing changes, so the scheduler can
// fail the step's requests and keep serving the rest. Each case below was once applied halfway
// (the tokens before the bad one appended) or not noticed at all.

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "engine/scheduler.hpp"
#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::create_scheduler;
using testing::fake_run;
using testing::greedy;
using testing::make_prompt;

struct seq_state {
  int num_computed = 0;
  int num_inflight = 0;
  int num_pending = 0;
  int num_outputs = 0;
  bool operator==(const seq_state&) const = default;
};

seq_state state_of(const scheduler& s, int64_t id) {
  const sequence* seq = s.find(id);
  if (seq == nullptr) return {-1, -1, -1, -1};
  return {seq->num_computed_tokens(), seq->num_inflight_tokens(), seq->num_pending_samples(), seq->num_output_tokens()};
}

// Two requests, both sampled by the first step (vocab 2000, so fake_run's 1000 + k fits).
struct two_requests {
  std::unique_ptr<scheduler> s;
  step_plan plan;

  two_requests() {
    engine_config config;
    config.num_kv_blocks = 32;
    config.block_size = 16;
    config.vocab_size = 2000;
    s = std::make_unique<scheduler>(config, std::vector<int32_t>{testing::test_eos});
    EXPECT_FALSE(s->add_request(1, make_prompt(5), greedy(4)));
    EXPECT_FALSE(s->add_request(2, make_prompt(7), greedy(4)));
    plan = s->schedule();
    EXPECT_EQ(plan.sequences.size(), 2u);
  }

  // update() must throw naming `expected_words` and leave both sequences as they were.
  void expect_refused(const step_result& result, const std::string& expected_words) {
    const seq_state before1 = state_of(*s, 1);
    const seq_state before2 = state_of(*s, 2);
    const int free_before = s->num_free_blocks();
    const std::string why = s->check_result(outline_of(plan), result).value_or("");
    EXPECT_NE(why.find(expected_words), std::string::npos) << why;
    try {
      s->update(plan, result);
      ADD_FAILURE() << "a malformed result was applied";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(expected_words), std::string::npos) << e.what();
    }
    EXPECT_EQ(state_of(*s, 1), before1) << "request 1 changed by a refused result";
    EXPECT_EQ(state_of(*s, 2), before2) << "request 2 changed by a refused result";
    EXPECT_EQ(s->num_free_blocks(), free_before);
    // The right result still applies afterwards.
    auto deltas = s->update(plan, fake_run(plan));
    EXPECT_EQ(deltas.size(), 2u);
    EXPECT_EQ(state_of(*s, 1).num_outputs, 1);
  }
};

TEST(scheduler_result_check, a_token_for_the_wrong_request_changes_nothing) {
  two_requests t;
  step_result result = fake_run(t.plan);
  result.tokens[1].request_id = 99;  // the first token is fine: it used to be appended before the throw
  t.expect_refused(result, "request 99");
}

TEST(scheduler_result_check, an_extra_token_changes_nothing) {
  two_requests t;
  step_result result = fake_run(t.plan);
  result.tokens.push_back(result.tokens[0]);  // a duplicate of request 1's token
  t.expect_refused(result, "3 sampled tokens, the plan samples 2");
}

TEST(scheduler_result_check, a_missing_token_changes_nothing) {
  two_requests t;
  step_result result = fake_run(t.plan);
  result.tokens.pop_back();
  t.expect_refused(result, "none for request 2");
}

TEST(scheduler_result_check, another_steps_result_is_refused) {
  two_requests t;
  step_result result = fake_run(t.plan);
  result.step_id = t.plan.step_id + 5;
  t.expect_refused(result, "the result of step " + std::to_string(t.plan.step_id + 5));
}

TEST(scheduler_result_check, a_token_outside_the_vocabulary_is_refused) {
  two_requests t;
  step_result result = fake_run(t.plan);
  result.tokens[1].token_id = 2000;
  t.expect_refused(result, "token 2000 for request 2, outside the vocabulary of 2000");
  result = fake_run(t.plan);
  result.tokens[0].token_id = -1;
  EXPECT_NE(t.s->check_result(outline_of(t.plan), result).value_or("").find("token -1"), std::string::npos);
}

TEST(scheduler_result_check, unequal_top_logprob_lists_are_refused) {
  two_requests t;
  step_result result = fake_run(t.plan);
  result.tokens[1].top_token_ids = {1, 2};
  result.tokens[1].top_logprobs = {-0.5f};
  t.expect_refused(result, "2 top token ids and 1 top logprobs");
}

}  // namespace
}  // namespace troupe
