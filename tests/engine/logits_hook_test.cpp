// The model runner's logits hook (engine/logits_hook.hpp): called on the host row of each request
// that names logits plugins, with its prompt and outputs so far, before sampling; never for a
// request that names none. A failure fails only its request (step_result::failed), and the
// scheduler's side drops it; without a hook such a request fails by name.

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "engine/model_runner.hpp"
#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::create_scheduler;
using testing::kv_echo_model;
using testing::make_prompt;

// Masks every token but `forced`, and remembers the history of each call; fails request
// `failing` on its call number `fail_at` (0-based).
class forcing_hook : public logits_hook {
 public:
  int32_t forced = 7;
  int64_t failing = -1;
  int fail_at = 0;
  std::map<int64_t, std::vector<std::vector<int32_t>>> histories;  // per request, per call
  std::map<int64_t, int> ends;

  std::string process(const std::vector<std::string>& names, int64_t request_id, std::span<const int32_t> token_ids,
                      int32_t num_prompt_tokens, std::span<float> logits) override {
    EXPECT_EQ(names, std::vector<std::string>{"force"});
    EXPECT_EQ(num_prompt_tokens, 6);
    auto& calls = histories[request_id];
    calls.emplace_back(token_ids.begin(), token_ids.end());
    if (request_id == failing && static_cast<int>(calls.size()) - 1 == fail_at) return "plugin 'force' gave up";
    for (size_t i = 0; i < logits.size(); ++i) {
      if (static_cast<int32_t>(i) != forced) logits[i] = -INFINITY;
    }
    return "";
  }
  void end(int64_t request_id, const std::vector<std::string>&) override { ++ends[request_id]; }
};

sampling_params with_plugin(int max_tokens) {
  sampling_params p = testing::greedy(max_tokens);
  p.logits_plugins = {"force"};
  return p;
}

TEST(logits_hook, changes_only_the_rows_of_requests_that_name_a_plugin_and_sees_their_history) {
  kv_echo_model m(16, 4, 32);
  model_runner runner(m, 1);
  auto hook_owner = std::make_unique<forcing_hook>();
  forcing_hook& hook = *hook_owner;
  runner.set_logits_hook(std::move(hook_owner));
  auto sched = create_scheduler(16, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(6), with_plugin(5)));
  ASSERT_FALSE(sched->add_request(2, make_prompt(6, 20), testing::greedy(5)));
  std::map<int64_t, std::vector<int32_t>> outputs;
  for (int step = 0; step < 50 && sched->has_unfinished(); ++step) {
    step_plan plan = sched->schedule();
    step_result result = runner.run(plan);
    EXPECT_TRUE(result.failed.empty());
    for (const sampled_token& t : result.tokens) outputs[t.request_id].push_back(t.token_id);
    sched->update(plan, result);
  }
  // Finished ids reach the worker with the next plan that runs something.
  ASSERT_FALSE(sched->add_request(9, make_prompt(6, 50), testing::greedy(1)));
  runner.run(sched->schedule());
  EXPECT_EQ(outputs[1], std::vector<int32_t>(5, 7));  // forced
  EXPECT_NE(outputs[2], std::vector<int32_t>(5, 7));  // the model's own
  EXPECT_EQ(hook.histories.count(2), 0u);
  ASSERT_EQ(hook.histories[1].size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    std::vector<int32_t> expected = make_prompt(6);
    expected.insert(expected.end(), k, 7);
    EXPECT_EQ(hook.histories[1][k], expected) << "call " << k;
  }
  EXPECT_EQ(hook.ends[1], 1);
  EXPECT_EQ(hook.ends.count(2), 0u);
}

TEST(logits_hook, a_failure_fails_only_its_request_once) {
  kv_echo_model m(16, 4, 32);
  model_runner runner(m, 1);
  auto hook_owner = std::make_unique<forcing_hook>();
  forcing_hook& hook = *hook_owner;
  hook.failing = 1;
  hook.fail_at = 2;
  runner.set_logits_hook(std::move(hook_owner));
  auto sched = create_scheduler(16, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(6), with_plugin(8)));
  ASSERT_FALSE(sched->add_request(3, make_prompt(6, 30), with_plugin(8)));
  std::vector<failed_request> failed;
  int num_tokens_3 = 0;
  for (int step = 0; step < 50 && sched->has_unfinished(); ++step) {
    step_plan plan = sched->schedule();
    step_result result = runner.run(plan);
    for (const failed_request& f : result.failed) {
      failed.push_back(f);
      sched->abort(f.request_id);  // as the scheduler stage does
    }
    for (const sampled_token& t : result.tokens) num_tokens_3 += t.request_id == 3 ? 1 : 0;
    sched->update(plan, result);
  }
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].request_id, 1);
  EXPECT_EQ(failed[0].why, "plugin 'force' gave up");
  EXPECT_EQ(hook.histories[1].size(), 3u);  // not called again once failed
  EXPECT_EQ(num_tokens_3, 8);
}

TEST(logits_hook, a_request_naming_plugins_fails_on_a_runner_without_a_hook) {
  kv_echo_model m(16, 4, 32);
  model_runner runner(m, 1);
  auto sched = create_scheduler(16, 4);
  ASSERT_FALSE(sched->add_request(1, make_prompt(6), with_plugin(3)));
  step_plan plan = sched->schedule();
  step_result result = runner.run(plan);
  ASSERT_EQ(result.failed.size(), 1u);
  EXPECT_NE(result.failed[0].why.find("this worker runs no logits plugins, and the request names plugin 'force'"),
            std::string::npos);
  EXPECT_FALSE(model_runner::samples_plainly(with_plugin(3)));  // the row must reach the host
}

}  // namespace
}  // namespace troupe
