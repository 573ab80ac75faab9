// The model_runner's choice between sampling on the host and on the model's device, without a
// GPU: a kv_echo model that "samples on its device" (greedy rows by argmax, others recorded)
// stands in for the CUDA model. Plain steps must go to forward_sample with the right rows and
// give the host path's tokens; anything the device sampler cannot do must stay on the host.
// Structured output: a constrained plain row goes to the device with its grammar's bit mask
// (the stand-in applies it), and the matcher follows the token the device chose.

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>

#include "engine/llm_engine.hpp"
#include "engine/model_runner.hpp"
#include "grammar/token_vocabulary.hpp"
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
    last_masks.clear();
    for (size_t r = 0; r < rows.size(); ++r) {
      const float* row = logits.data() + r * config().vocab_size;
      const std::span<const uint64_t> bits = rows[r].allowed_bits;
      last_masks.emplace_back(bits.begin(), bits.end());
      auto allowed = [&](int t) {
        return bits.empty() ||
               (static_cast<size_t>(t) / 64 < bits.size() && (bits[static_cast<size_t>(t) / 64] >> (t & 63) & 1));
      };
      // Greedy like the GPU's argmax (refused tokens count as -inf, ties to the lowest id).
      int best = -1;
      for (int t = 0; t < config().vocab_size; ++t) {
        if (allowed(t) && (best < 0 || row[t] > row[best])) best = t;
      }
      if (rows[r].temperature == 0.0f) {
        tokens[r] = best;
      } else if (!bits.empty()) {
        // Masked sampled rows take the highest allowed id: a choice the host would rarely make,
        // so a test sees that the grammar follows the device's token.
        int last = best;
        for (int t = 0; t < config().vocab_size; ++t) last = allowed(t) ? t : last;
        tokens[r] = last;
      } else {
        tokens[r] = (best + 1) % config().vocab_size;  // the runner-up, so a test sees which path ran
      }
    }
  }

  int num_device_steps = 0;
  std::vector<device_sampling_row> last_rows;
  std::vector<std::vector<uint64_t>> last_masks;  // [rows] copies of the rows' allowed_bits
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

// kv_echo's 264 ids as the grammar sees them: 0, 1 and 2 (EOS) add no text, 3 + b is byte b,
// 259 is "ab" and 260 "cd", the rest special. Five mask words.
constexpr int masked_vocab = 264;
constexpr int32_t byte_token(char c) { return 3 + static_cast<unsigned char>(c); }

std::shared_ptr<const token_vocabulary> echo_vocabulary() {
  std::vector<std::string> bytes(masked_vocab);
  for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(3 + b)] = std::string(1, static_cast<char>(b));
  bytes[259] = "ab";
  bytes[260] = "cd";
  return std::make_shared<token_vocabulary>(std::move(bytes), std::vector<int32_t>{testing::test_eos});
}

bool has_bit(const std::vector<uint64_t>& bits, int32_t t) {
  return static_cast<size_t>(t) / 64 < bits.size() && (bits[static_cast<size_t>(t) / 64] >> (t & 63) & 1) != 0;
}

sampling_params constrained(float temperature, int max_tokens = 12) {
  sampling_params p = testing::greedy(max_tokens, /*ignore_eos=*/false);
  p.temperature = temperature;
  p.seed = 5;
  p.guided = {guided_kind::regex, "(ab|cd)e", {}};
  return p;
}

// A constrained request starts with its history (the prompt), as the scheduler sends it.
step_plan constrained_plan(std::vector<sampling_params> params) {
  step_plan plan = prefill_plan(std::move(params));
  for (scheduled_sequence& s : plan.sequences) {
    s.penalty_token_ids = s.new_token_ids;
    s.num_prompt_tokens = static_cast<int32_t>(s.new_token_ids.size());
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

TEST(device_sampling, a_constrained_plain_row_goes_to_the_device_with_its_grammars_bits) {
  device_sampling_model on_device(8, 4, masked_vocab);
  kv_echo_model on_host(8, 4, masked_vocab);
  model_runner device_runner(on_device, 1);
  model_runner host_runner(on_host, 1);
  device_runner.set_vocabulary(echo_vocabulary());
  host_runner.set_vocabulary(echo_vocabulary());
  const auto plan = constrained_plan({constrained(0.0f), testing::greedy(5)});
  const step_result a = device_runner.run(plan);
  const step_result b = host_runner.run(plan);
  ASSERT_TRUE(device_runner.last_run_sampled_on_device());
  ASSERT_EQ(on_device.num_device_steps, 1);
  ASSERT_EQ(on_device.last_masks.size(), 2u);
  // Row 0 carries (ab|cd)e's first mask: "a", "c", "ab", "cd" and nothing else; row 1 none.
  const std::vector<uint64_t>& bits = on_device.last_masks[0];
  EXPECT_EQ(bits.size(), static_cast<size_t>((masked_vocab + 63) / 64));
  for (int32_t t = 0; t < masked_vocab; ++t) {
    const bool expected = t == byte_token('a') || t == byte_token('c') || t == 259 || t == 260;
    EXPECT_EQ(has_bit(bits, t), expected) << "token " << t;
  }
  EXPECT_TRUE(on_device.last_masks[1].empty());
  ASSERT_EQ(a.tokens.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(a.tokens[i].token_id, b.tokens[i].token_id) << i;
  EXPECT_TRUE(has_bit(bits, a.tokens[0].token_id));
}

TEST(device_sampling, constrained_rows_with_penalties_logprobs_or_no_bit_mask_stay_on_the_host) {
  sampling_params with_penalty = constrained(0.0f);
  with_penalty.repetition_penalty = 1.2f;
  sampling_params with_logprobs = constrained(0.0f);
  with_logprobs.logprobs = 1;
  sampling_params with_min_p = constrained(1.0f);
  with_min_p.min_p = 0.1f;
  // Two tokens left (output 2 of 4): the length rule cuts the state's mask, so it has no bits.
  const sampling_params without_bits = constrained(0.0f, 4);
  for (const sampling_params& odd : {with_penalty, with_logprobs, with_min_p, without_bits}) {
    device_sampling_model m(8, 4, masked_vocab);
    model_runner runner(m, 1);
    runner.set_vocabulary(echo_vocabulary());
    const step_result r = runner.run(constrained_plan({constrained(0.0f), odd}));
    EXPECT_FALSE(runner.last_run_sampled_on_device());
    EXPECT_EQ(m.num_device_steps, 0);
    ASSERT_EQ(r.tokens.size(), 2u);
  }
  EXPECT_TRUE(model_runner::samples_plainly_but_for_constraint(constrained(1.0f)));
  EXPECT_FALSE(model_runner::samples_plainly(constrained(1.0f)));
}

TEST(device_sampling, the_grammar_follows_the_token_the_device_chose) {
  auto owned = std::make_unique<device_sampling_model>(64, 4, masked_vocab);
  device_sampling_model& m = *owned;
  engine_config config;
  config.block_size = 4;
  config.num_kv_blocks = 64;
  llm_engine engine(std::move(owned), config, std::vector<int32_t>{testing::test_eos}, 3);
  engine.set_vocabulary(echo_vocabulary());
  // Sampled: the stand-in device takes the highest allowed id, "cd" (260), which the host's
  // draw need not; the grammar must then allow only "e", and after it only the end.
  const add_request_result added = engine.add_request({10, 11, 12}, constrained(1.0f));
  ASSERT_TRUE(added.ok()) << added.error->message;
  std::vector<int32_t> ids;
  std::vector<std::vector<uint64_t>> masks;
  int device_steps_seen = 0;
  for (int step = 0; step < 20 && engine.has_unfinished(); ++step) {
    for (const request_output& out : engine.step()) ids.insert(ids.end(), out.token_ids.begin(), out.token_ids.end());
    if (m.num_device_steps > device_steps_seen) {
      device_steps_seen = m.num_device_steps;
      masks.push_back(m.last_masks.at(0));
    }
  }
  ASSERT_FALSE(engine.has_unfinished());
  EXPECT_EQ(ids, (std::vector<int32_t>{260, byte_token('e'), testing::test_eos}));
  // Two steps on the device, with bits; the accepting state (EOS allowed) has none: the host.
  ASSERT_EQ(masks.size(), 2u);
  for (int32_t t = 0; t < masked_vocab; ++t) EXPECT_EQ(has_bit(masks[1], t), t == byte_token('e')) << "token " << t;
}

}  // namespace
}  // namespace troupe
