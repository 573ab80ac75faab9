// Overlapped scheduling on the plain classes: the scheduler plans step N+1 before step N's
// result is applied, the model_runner fills in "the token sampled in the previous step", and
// the outputs must equal the synchronous engine's, token for token. The kv_echo model reads
// every token back through the block tables, so a wrong slot, a block reused too early or a
// wrong placeholder changes what it predicts.

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <set>

#include "engine/model_runner.hpp"
#include "engine/scheduler.hpp"
#include "model/stage_lost_error.hpp"
#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::create_scheduler;
using testing::kv_echo_model;
using testing::make_prompt;

struct request_outcome {
  std::vector<int32_t> tokens;
  finish_reason finish = finish_reason::none;
  bool operator==(const request_outcome&) const = default;
};

using outcomes = std::map<int64_t, request_outcome>;

void collect(outcomes& into, const std::vector<token_delta>& deltas) {
  for (const token_delta& d : deltas) {
    auto& o = into[d.request_id];
    EXPECT_EQ(o.finish, finish_reason::none) << "request " << d.request_id << " got a delta after finishing";
    o.tokens.insert(o.tokens.end(), d.token_ids.begin(), d.token_ids.end());
    if (d.finished()) o.finish = d.finish;
  }
}

// The scheduler stage's order of events with two plans out: plan ahead until two are in
// flight, then run and apply the oldest. `before_step(k)` runs before the k-th result is applied.
struct overlapped_driver {
  scheduler& sched;
  model_runner& runner;
  std::deque<step_plan> in_flight;
  int num_steps = 0;
  int num_placeholders = 0;

  bool step(outcomes& out) {
    while (in_flight.size() < 2 && sched.has_unfinished()) {
      step_plan plan = sched.schedule();
      if (plan.empty()) break;
      for (const auto& s : plan.sequences) num_placeholders += s.input_from_previous_sample ? 1 : 0;
      in_flight.push_back(std::move(plan));
    }
    if (in_flight.empty()) return false;
    step_plan plan = std::move(in_flight.front());
    in_flight.pop_front();
    const step_result result = runner.run(plan);
    collect(out, sched.update(plan, result));
    ++num_steps;
    return true;
  }
};

sampling_params params_for(int i, bool sampled) {
  sampling_params p;
  p.max_tokens = 3 + i % 11;
  p.ignore_eos = false;
  p.stop_token_ids = {7 + i % 5};  // ends some requests early: their extra token must vanish
  if (sampled) {
    p.temperature = 1.0f;
    p.seed = 1000 + i;
    p.frequency_penalty = 0.5f;
    p.repetition_penalty = 1.3f;
  } else {
    p.temperature = 0.0f;
  }
  return p;
}

struct engine_shape {
  int num_blocks = 14;
  int block_size = 4;
  int max_batched_tokens = 9;
  int max_num_seqs = 6;
};

outcomes run_requests(bool overlapped, bool sampled, int num_requests, const engine_shape& shape,
                      int* num_placeholders = nullptr) {
  kv_echo_model model(shape.num_blocks, shape.block_size, /*vocab_size=*/24);
  model_runner runner(model, /*sampler_seed=*/5);
  auto sched = create_scheduler(shape.num_blocks, shape.block_size, shape.max_batched_tokens, shape.max_num_seqs);
  for (int i = 0; i < num_requests; ++i) {
    EXPECT_FALSE(sched->add_request(i, make_prompt(2 + i % 7, 3 + i), params_for(i, sampled), i % 2));
  }
  outcomes out;
  if (overlapped) {
    overlapped_driver driver{*sched, runner};
    while (driver.step(out) && driver.num_steps < 5000) {
    }
    if (num_placeholders) *num_placeholders = driver.num_placeholders;
  } else {
    for (int steps = 0; sched->has_unfinished() && steps < 5000; ++steps) {
      step_plan plan = sched->schedule();
      collect(out, sched->update(plan, runner.run(plan)));
    }
  }
  EXPECT_FALSE(sched->has_unfinished());
  EXPECT_EQ(sched->num_free_blocks(), shape.num_blocks) << "a block leaked";
  return out;
}

TEST(async_scheduling, greedy_outputs_equal_the_synchronous_engine_under_preemption_and_chunking) {
  int num_placeholders = 0;
  const outcomes sync = run_requests(false, false, 24, {});
  const outcomes overlapped = run_requests(true, false, 24, {}, &num_placeholders);
  ASSERT_EQ(sync.size(), 24u);
  EXPECT_EQ(overlapped, sync);
  EXPECT_GT(num_placeholders, 0) << "no step was planned ahead: the test did not overlap anything";
  int num_stopped = 0;
  for (const auto& [id, o] : sync) num_stopped += o.finish == finish_reason::stop ? 1 : 0;
  EXPECT_GT(num_stopped, 0) << "no request hit its stop id: nothing exercised the discarded extra token";
}

TEST(async_scheduling, seeded_sampling_with_penalties_equals_the_synchronous_engine) {
  // The penalties must count the placeholder token, which only the runner knows.
  EXPECT_EQ(run_requests(true, true, 16, {}), run_requests(false, true, 16, {}));
}

TEST(async_scheduling, a_roomy_pool_and_budget_also_match) {
  const engine_shape roomy{64, 8, 256, 32};
  EXPECT_EQ(run_requests(true, false, 30, roomy), run_requests(false, false, 30, roomy));
}

TEST(async_scheduling, the_step_ahead_continues_every_running_sequence_with_a_placeholder) {
  auto sched = create_scheduler(16, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(5), testing::greedy(4)));
  ASSERT_FALSE(sched->add_request(2, make_prompt(3, 40), testing::greedy(4)));
  const step_plan first = sched->schedule();
  const step_plan ahead = sched->schedule();
  ASSERT_EQ(ahead.sequences.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const scheduled_sequence& s = ahead.sequences[i];
    EXPECT_TRUE(s.input_from_previous_sample);
    EXPECT_EQ(s.new_token_ids, std::vector<int32_t>{-1});
    EXPECT_EQ(s.num_computed_tokens, first.sequences[i].num_computed_tokens + first.sequences[i].num_new_tokens());
    EXPECT_TRUE(s.sample);
    EXPECT_EQ(s.output_index, 1);
  }
  // A third plan before any result would need two unknown tokens: nothing is left to plan.
  EXPECT_TRUE(sched->schedule().empty());
}

TEST(async_scheduling, a_request_whose_last_token_is_in_flight_is_not_planned_again) {
  auto sched = create_scheduler(16, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(4), testing::greedy(1)));
  ASSERT_EQ(sched->schedule().sequences.size(), 1u);
  EXPECT_TRUE(sched->schedule().empty()) << "max_tokens 1 is reached by the step in flight";
}

TEST(async_scheduling, a_stop_in_step_n_discards_the_token_of_step_n_plus_one) {
  auto sched = create_scheduler(16, 4);
  sampling_params p = testing::greedy(10);
  p.stop_token_ids = {1000};
  ASSERT_FALSE(sched->add_request(1, make_prompt(4), p));
  const step_plan n = sched->schedule();
  const step_plan n1 = sched->schedule();
  ASSERT_EQ(n1.sequences.size(), 1u);
  auto deltas = sched->update(n, testing::fake_run(n));  // token 1000: the stop id
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].finish, finish_reason::stop);
  EXPECT_EQ(sched->num_free_blocks(), 16);
  EXPECT_TRUE(sched->update(n1, testing::fake_run(n1)).empty()) << "the extra token must not reach anyone";
  EXPECT_FALSE(sched->has_unfinished());
}

TEST(async_scheduling, an_abort_with_two_steps_in_flight_ignores_both_results) {
  auto sched = create_scheduler(16, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(4), testing::greedy(10)));
  ASSERT_FALSE(sched->add_request(2, make_prompt(4, 50), testing::greedy(3)));
  const step_plan n = sched->schedule();
  const step_plan n1 = sched->schedule();
  ASSERT_TRUE(sched->abort(1));
  auto deltas = sched->update(n, testing::fake_run(n));
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].request_id, 2);
  deltas = sched->update(n1, testing::fake_run(n1));
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].request_id, 2);
  EXPECT_EQ(deltas[0].token_ids, std::vector<int32_t>{1001});
}

TEST(async_scheduling, an_aborted_id_reused_while_its_old_step_is_in_flight_is_not_confused) {
  auto sched = create_scheduler(16, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(4), testing::greedy(10)));
  const step_plan n = sched->schedule();
  ASSERT_TRUE(sched->abort(1));
  ASSERT_FALSE(sched->add_request(1, make_prompt(4), testing::greedy(10)));  // same id, same prompt
  const step_plan n1 = sched->schedule();
  ASSERT_EQ(n1.sequences.size(), 1u);
  EXPECT_EQ(n1.sequences[0].num_computed_tokens, 0);  // the new one starts over (no cached block yet)
  EXPECT_TRUE(sched->update(n, testing::fake_run(n)).empty()) << "the old incarnation's result is stale";
  auto deltas = sched->update(n1, testing::fake_run(n1));
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].token_ids, std::vector<int32_t>{1000});
  EXPECT_EQ(sched->find(1)->num_computed_tokens(), 4);
}

TEST(async_scheduling, the_runner_fills_in_its_previous_samples_and_refuses_unknown_ones) {
  kv_echo_model model(8, 4, 24);
  model_runner runner(model, 1);
  step_plan first;
  first.step_id = 0;
  scheduled_sequence s;
  s.request_id = 3;
  s.new_token_ids = {5, 6, 7};
  s.block_table = {0};
  s.sample = true;
  s.params = sampling_params{};
  first.sequences.push_back(s);
  const step_result r0 = runner.run(first);
  ASSERT_EQ(r0.tokens.size(), 1u);

  step_plan second;
  second.step_id = 1;
  scheduled_sequence next = s;
  next.num_computed_tokens = 3;
  next.new_token_ids = {-1};
  next.input_from_previous_sample = true;
  next.output_index = 1;
  second.sequences.push_back(next);
  const step_result r1 = runner.run(second);
  EXPECT_EQ(runner.last_batch().token_ids, std::vector<int32_t>{r0.tokens[0].token_id});
  ASSERT_EQ(r1.tokens.size(), 1u);
  EXPECT_EQ(r1.tokens[0].token_id, kv_echo_model::next_token({5, 6, 7, r0.tokens[0].token_id}, 24));

  // Only the run right before counts: step 0's sample is gone, and an unknown request fails.
  step_plan stale = second;
  stale.step_id = 2;
  stale.sequences[0].request_id = 4;
  EXPECT_THROW(runner.run(stale), std::runtime_error);
}

// Overlapped scheduling plans step N+1 before step N's failure is known (a pipeline stage died,
// the device failed): N+1 fails with N's cause, so every request it fails learns what broke,
// and the cause does not nest however many steps follow.
TEST(async_scheduling, a_step_after_a_failed_step_fails_with_the_first_failures_cause) {
  kv_echo_model model(8, 4, 24);
  model_runner runner(model, 1);
  scheduled_sequence s;
  s.request_id = 3;
  s.new_token_ids = {5, 6, 7};
  s.block_table = {99};  // outside the pool of 8 blocks: the step throws
  s.sample = true;
  s.params = sampling_params{};
  step_plan broken;
  broken.step_id = 0;
  broken.sequences.push_back(s);
  std::string cause;
  try {
    runner.run(broken);
  } catch (const std::runtime_error& e) {
    cause = e.what();
  }
  ASSERT_NE(cause.find("block id 99"), std::string::npos) << cause;

  scheduled_sequence next = s;
  next.block_table = {0};
  next.num_computed_tokens = 3;
  next.new_token_ids = {-1};
  next.input_from_previous_sample = true;
  next.output_index = 1;
  for (uint64_t step = 1; step <= 2; ++step) {
    step_plan after;
    after.step_id = step;
    after.sequences.push_back(next);
    try {
      runner.run(after);
      ADD_FAILURE() << "step " << step << " ran without the samples of the failed step";
    } catch (const std::runtime_error& e) {
      const std::string why = e.what();
      EXPECT_NE(why.find("which failed: " + cause), std::string::npos) << why;
      EXPECT_EQ(why.find("needs the samples"), why.rfind("needs the samples")) << "the cause nested: " << why;
    }
  }
  // A step that asks for nothing runs, and afterwards an unknown sample is a malformed plan again.
  scheduled_sequence fresh = s;
  fresh.request_id = 5;
  fresh.block_table = {1};
  step_plan clean;
  clean.step_id = 3;
  clean.sequences.push_back(fresh);
  ASSERT_EQ(runner.run(clean).tokens.size(), 1u);
  step_plan stale;
  stale.step_id = 4;
  stale.sequences.push_back(next);
  try {
    runner.run(stale);
    ADD_FAILURE() << "a step asking for a sample nobody drew ran";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("which sampled none"), std::string::npos) << e.what();
  }
}

// A model part that runs elsewhere was lost (a pipeline stage): the runner's failure keeps its
// type, also for the step planned behind it, so the scheduler puts the requests back instead of
// failing them (model/stage_lost_error.hpp); the next failure of another kind is plain again.
TEST(async_scheduling, a_step_after_a_lost_stage_fails_as_a_lost_stage_too) {
  class losing_model : public kv_echo_model {
   public:
    using kv_echo_model::kv_echo_model;
    bool lost = false;
    void forward(const forward_batch& batch, float* logits) override {
      if (lost) throw stage_lost_error("pipeline stage 0-1 at kvtcp://127.0.0.1:1: connection lost");
      kv_echo_model::forward(batch, logits);
    }
  };
  losing_model model(8, 4, 24);
  model_runner runner(model, 1);
  scheduled_sequence s;
  s.request_id = 3;
  s.new_token_ids = {5, 6, 7};
  s.block_table = {0};
  s.sample = true;
  s.params = sampling_params{};
  step_plan first;
  first.step_id = 0;
  first.sequences.push_back(s);
  model.lost = true;
  EXPECT_THROW(runner.run(first), stage_lost_error);
  model.lost = false;
  scheduled_sequence next = s;
  next.num_computed_tokens = 3;
  next.new_token_ids = {-1};
  next.input_from_previous_sample = true;
  next.output_index = 1;
  step_plan after;
  after.step_id = 1;
  after.sequences.push_back(next);
  try {
    runner.run(after);
    ADD_FAILURE() << "a step ran without the samples of the failed step";
  } catch (const stage_lost_error& e) {
    EXPECT_NE(std::string(e.what()).find("which failed: pipeline stage 0-1"), std::string::npos) << e.what();
  }
  // Another kind of failure (a block outside the pool) is not a lost stage, nor is the step after it.
  scheduled_sequence broken = s;
  broken.block_table = {99};
  step_plan bad;
  bad.step_id = 2;
  bad.sequences.push_back(broken);
  bool lost_type = true;
  try {
    runner.run(bad);
  } catch (const stage_lost_error&) {
  } catch (const std::runtime_error&) {
    lost_type = false;
  }
  EXPECT_FALSE(lost_type);
  after.step_id = 3;
  try {
    runner.run(after);
    ADD_FAILURE() << "a step ran without the samples of the failed step";
  } catch (const stage_lost_error& e) {
    ADD_FAILURE() << "a lost stage's type outlived the next failure: " << e.what();
  } catch (const std::runtime_error&) {
  }
}

// The plain scheduler's half: every running sequence gives its blocks back and waits, keeping its
// outputs; the next plan names them as preempted and sends their whole history again.
TEST(async_scheduling, recompute_all_running_puts_every_running_request_back_with_its_outputs) {
  engine_config config;
  config.block_size = 4;
  config.num_kv_blocks = 16;
  config.max_num_batched_tokens = 32;
  config.vocab_size = 24;
  scheduler sched(config, {testing::test_eos});
  sampling_params params;
  params.max_tokens = 10;
  params.ignore_eos = true;
  ASSERT_FALSE(sched.add_request(1, {5, 6, 7}, params).has_value());
  ASSERT_FALSE(sched.add_request(2, {8, 9}, params).has_value());
  kv_echo_model model(16, 4, 24);
  model_runner runner(model, 1);
  for (int step = 0; step < 3; ++step) {
    const step_plan plan = sched.schedule();
    sched.update(plan, runner.run(plan));
  }
  const int outputs_1 = sched.find(1)->num_output_tokens();
  ASSERT_EQ(outputs_1, 3);
  EXPECT_EQ(sched.recompute_all_running(), 2);
  EXPECT_EQ(sched.num_running(), 0);
  EXPECT_EQ(sched.num_waiting(), 2);
  EXPECT_EQ(sched.num_free_blocks(), 16);
  EXPECT_EQ(sched.find(1)->num_output_tokens(), outputs_1);
  const step_plan again = sched.schedule();
  EXPECT_EQ(std::set<int64_t>(again.preempted_ids.begin(), again.preempted_ids.end()), (std::set<int64_t>{1, 2}));
  ASSERT_EQ(again.sequences.size(), 2u);
  for (const scheduled_sequence& entry : again.sequences) {
    EXPECT_EQ(entry.num_computed_tokens, 0);
    EXPECT_EQ(entry.block_table_start, 0);
  }
  // Run to the end: the outputs equal an undisturbed run's (the echo model reads the whole context).
  sched.update(again, runner.run(again));
  for (int step = 0; step < 20 && sched.has_unfinished(); ++step) {
    const step_plan plan = sched.schedule();
    sched.update(plan, runner.run(plan));
  }
  EXPECT_FALSE(sched.has_unfinished());
  EXPECT_EQ(sched.num_free_blocks(), 16);
}

}  // namespace
}  // namespace troupe
