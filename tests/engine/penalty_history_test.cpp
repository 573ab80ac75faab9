// Penalty histories live on the worker, like block tables: the entry that starts a request on the
// worker (new, or back after preemption) carries its prompt and outputs so far, later entries
// carry nothing, and the runner appends every token it samples. Checked from both sides.

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "engine/model_runner.hpp"
#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::create_scheduler;
using testing::fake_run;
using testing::kv_echo_model;
using testing::make_prompt;

sampling_params penalized(int max_tokens) {
  sampling_params p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 2.0f;  // the most the rules allow
  return p;
}

std::vector<int32_t> tokens_of(const sequence& seq) { return {seq.token_ids().begin(), seq.token_ids().end()}; }

TEST(penalty_history, only_the_entry_that_starts_a_request_carries_it) {
  // 6 blocks of 4 tokens: two 8-token prompts outgrow the pool, so one is preempted and comes back.
  auto sched = create_scheduler(6, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(8), penalized(12)));
  ASSERT_FALSE(sched->add_request(2, make_prompt(8, 40), penalized(12)));
  int num_starts = 0, num_readmissions = 0, num_later = 0;
  std::set<int64_t> preempted;
  for (int step = 0; step < 80 && sched->has_unfinished(); ++step) {
    step_plan plan = sched->schedule();
    for (int64_t id : plan.preempted_ids) preempted.insert(id);
    for (const scheduled_sequence& s : plan.sequences) {
      const sequence& seq = *sched->find(s.request_id);
      if (s.block_table_start == 0) {
        ++num_starts;
        if (preempted.erase(s.request_id)) ++num_readmissions;
        // The whole history, outputs included after a preemption.
        EXPECT_EQ(s.penalty_token_ids, tokens_of(seq)) << "step " << step;
        EXPECT_EQ(s.num_prompt_tokens, 8);
      } else {
        ++num_later;
        EXPECT_TRUE(s.penalty_token_ids.empty())
            << "step " << step << " resends request " << s.request_id << "'s history";
      }
    }
    sched->update(plan, fake_run(plan));
  }
  EXPECT_FALSE(sched->has_unfinished());
  EXPECT_GE(num_readmissions, 1);
  EXPECT_GT(num_later, num_starts);
}

TEST(penalty_history, the_runner_keeps_each_history_in_step_with_the_scheduler) {
  // Through preemption and recompute: after every step the runner's history of each running
  // request is exactly the scheduler's prompt + outputs.
  kv_echo_model m(10, 4, 32);
  model_runner runner(m, 1);
  auto sched = create_scheduler(10, 4, /*max_num_batched_tokens=*/16);
  for (int id = 1; id <= 3; ++id) ASSERT_FALSE(sched->add_request(id, make_prompt(6, id * 3), penalized(14)));
  int num_checked = 0;
  bool saw_preemption = false;
  for (int step = 0; step < 200 && sched->has_unfinished(); ++step) {
    step_plan plan = sched->schedule();
    saw_preemption = saw_preemption || !plan.preempted_ids.empty();
    sched->update(plan, runner.run(plan));
    for (int id = 1; id <= 3; ++id) {
      const sequence* seq = sched->find(id);
      if (seq == nullptr || seq->status() != sequence_status::running || seq->num_output_tokens() == 0) continue;
      const std::vector<int32_t>* held = runner.penalty_history(id);
      ASSERT_NE(held, nullptr) << "step " << step << " request " << id;
      EXPECT_EQ(*held, tokens_of(*seq)) << "step " << step << " request " << id;
      ++num_checked;
    }
  }
  EXPECT_FALSE(sched->has_unfinished());
  EXPECT_TRUE(saw_preemption);
  EXPECT_GT(num_checked, 20);
}

}  // namespace
}  // namespace troupe
