// The model_runner's choice between sampling on the host and on the model's device, without a
// GPU: a kv_echo model that "samples on its device" (greedy rows by argmax, others recorded)
// stands in for the CUDA model. Plain steps must go to forward_sample with the right rows and
// give the host path's tokens; anything the device sampler cannot do must stay on the host.

#include <gtest/gtest.h>

#include <algorithm>

#include "engine/model_runner.hpp"
#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::kv_echo_model;

class device_sampling_model : public kv_echo_model {
 public:
  using kv_echo_model::kv_echo_model;

  bool can_sample_on_device() const override { return true; }

  void forward_sample(const forward_batch& batch, std::span<const device_sampling_row> rows, int32_t* tokens) override {
    ++num_device_steps;
    last_rows.assign(rows.begin(), rows.end());
    ASSERT_EQ(rows.size(), static_cast<size_t>(batch.num_logits()));
    std::vector<float> logits(static_cast<size_t>(batch.num_logits()) * config().vocab_size);
    forward(batch, logits.data());
    for (size_t r = 0; r < rows.size(); ++r) {
      const float* row = logits.data() + r * config().vocab_size;
      // Greedy like the GPU's argmax; other rows take the runner-up, so a test sees which path ran.
      const int best = static_cast<int>(std::max_element(row, row + config().vocab_size) - row);
      tokens[r] = rows[r].temperature == 0.0f ? best : (best + 1) % config().vocab_size;
    }
  }

  int num_device_steps = 0;
  std::vector<device_sampling_row> last_rows;
};

step_plan prefill_plan(std::vector<sampling_params> params) {
  step_plan plan;
  for (size_t i = 0; i < params.size(); ++i) {
    scheduled_sequence s;
    s.request_id = static_cast<int64_t>(i) + 7;
    s.new_token_ids = {static_cast<int32_t>(3 + i), 4, 5};
    s.block_table = {static_cast<int32_t>(i)};
    s.sample = true;
    s.output_index = 2;
    s.params = params[i];
    plan.sequences.push_back(s);
  }
  return plan;
}

TEST(device_sampling, plain_greedy_steps_sample_on_the_device_with_the_host_tokens) {
  device_sampling_model on_device(8, 4, 24);
  kv_echo_model on_host(8, 4, 24);
  model_runner device_runner(on_device, 1);
  model_runner host_runner(on_host, 1);
  const auto plan = prefill_plan({testing::greedy(5), testing::greedy(5)});
  const step_result a = device_runner.run(plan);
  const step_result b = host_runner.run(plan);
  EXPECT_TRUE(device_runner.last_run_sampled_on_device());
  EXPECT_FALSE(host_runner.last_run_sampled_on_device());
  EXPECT_EQ(on_device.num_device_steps, 1);
  ASSERT_EQ(a.tokens.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(a.tokens[i].request_id, b.tokens[i].request_id);
    EXPECT_EQ(a.tokens[i].token_id, b.tokens[i].token_id);
  }
}

TEST(device_sampling, seeded_rows_carry_the_seed_and_output_index_of_the_host_draw) {
  device_sampling_model m(8, 4, 24);
  model_runner runner(m, 1);
  sampling_params seeded;
  seeded.temperature = 0.8f;
  seeded.top_k = 5;
  seeded.top_p = 0.9f;
  seeded.seed = 1234;
  sampling_params unseeded = seeded;
  unseeded.seed.reset();
  runner.run(prefill_plan({seeded, unseeded}));
  ASSERT_TRUE(runner.last_run_sampled_on_device());
  ASSERT_EQ(m.last_rows.size(), 2u);
  EXPECT_FLOAT_EQ(m.last_rows[0].temperature, 0.8f);
  EXPECT_EQ(m.last_rows[0].top_k, 5);
  EXPECT_FLOAT_EQ(m.last_rows[0].top_p, 0.9f);
  EXPECT_EQ(m.last_rows[0].seed, 1234u);
  EXPECT_EQ(m.last_rows[0].offset, 2u);  // the output index, as the host sampler keys its draw
  EXPECT_EQ(m.last_rows[1].offset, 0u);  // unseeded: a fresh seed from the runner's generator
}

TEST(device_sampling, steps_needing_the_host_sampler_stay_on_the_host) {
  sampling_params with_logprobs = testing::greedy(5);
  with_logprobs.logprobs = 2;
  sampling_params with_penalty = testing::greedy(5);
  with_penalty.repetition_penalty = 1.2f;
  sampling_params with_min_p = testing::greedy(5);
  with_min_p.temperature = 1.0f;
  with_min_p.min_p = 0.1f;
  for (const sampling_params& odd : {with_logprobs, with_penalty, with_min_p}) {
    device_sampling_model m(8, 4, 24);
    model_runner runner(m, 1);
    // One odd request keeps the whole step on the host: its logits must come down anyway.
    auto plan = prefill_plan({testing::greedy(5), odd});
    if (uses_penalties(odd)) {
      plan.sequences[1].penalty_token_ids = plan.sequences[1].new_token_ids;
      plan.sequences[1].num_prompt_tokens = 3;
    }
    const step_result r = runner.run(plan);
    EXPECT_FALSE(runner.last_run_sampled_on_device());
    EXPECT_EQ(m.num_device_steps, 0);
    EXPECT_EQ(r.tokens.size(), 2u);
  }
  EXPECT_FALSE(model_runner::samples_plainly(with_logprobs));
  EXPECT_TRUE(model_runner::samples_plainly(testing::greedy(5)));
}

TEST(device_sampling, can_be_turned_off_and_placeholders_still_work_on_the_device) {
  device_sampling_model m(8, 4, 24);
  model_runner off(m, 1, /*device_sampling=*/false);
  off.run(prefill_plan({testing::greedy(5)}));
  EXPECT_FALSE(off.last_run_sampled_on_device());

  model_runner runner(m, 1);
  const step_result first = runner.run(prefill_plan({testing::greedy(5)}));
  step_plan next;
  next.step_id = 1;
  scheduled_sequence s = prefill_plan({testing::greedy(5)}).sequences[0];
  s.num_computed_tokens = 3;
  s.new_token_ids = {-1};
  s.input_from_previous_sample = true;
  next.sequences.push_back(s);
  const step_result second = runner.run(next);
  EXPECT_TRUE(runner.last_run_sampled_on_device());
  EXPECT_EQ(runner.last_batch().token_ids, std::vector<int32_t>{first.tokens[0].token_id});
  EXPECT_EQ(second.tokens[0].token_id, kv_echo_model::next_token({3, 4, 5, first.tokens[0].token_id}, 24));
}

}  // namespace
}  // namespace troupe
