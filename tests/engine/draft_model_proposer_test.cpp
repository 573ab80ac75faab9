// The draft-model proposer: its drafts are the draft model's own greedy continuation, whatever
// the verification accepted before (rollback), however many requests share its forwards, and
// within what its KV pool and context can hold. kv_echo_model predicts from every KV slot it
// reads back, so a stale or misplaced draft KV slot changes the drafts; stories260K, drafting
// for itself, must propose exactly the target's own greedy output.

#include "engine/draft_model_proposer.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "engine/llm_engine.hpp"
#include "backends/cpu/cpu_model.hpp"
#include "model/loader/model_loader.hpp"
#include "model/model_maker.hpp"
#include "engine/served_model.hpp"
#include "tests/scratch_dir.hpp"
#include "tests/engine/engine_test_support.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

using testing::kv_echo_model;

constexpr int echo_vocab = 97;

// kv_echo_model's greedy continuation of `history`: what a draft of it must propose.
std::vector<int32_t> echo_continuation(std::vector<int32_t> history, int count) {
  std::vector<int32_t> out;
  for (int i = 0; i < count; ++i) {
    out.push_back(kv_echo_model::next_token(history, echo_vocab));
    history.push_back(out.back());
  }
  return out;
}

std::vector<std::vector<int32_t>> propose(draft_proposer& proposer, const std::vector<draft_request>& requests) {
  std::vector<std::vector<int32_t>> drafts;
  proposer.propose(requests, drafts);
  return drafts;
}

std::vector<int32_t> propose_one(draft_proposer& proposer, int64_t id, const std::vector<int32_t>& history,
                                 int max_drafts) {
  return propose(proposer, {draft_request{id, history, max_drafts}}).at(0);
}

std::vector<int32_t> sequence(int length, int32_t first) {
  std::vector<int32_t> ids;
  for (int i = 0; i < length; ++i) ids.push_back(3 + (first + 7 * i) % (echo_vocab - 3));
  return ids;
}

TEST(draft_model_proposer, drafts_are_the_draft_models_greedy_continuation) {
  kv_echo_model draft(64, 4, echo_vocab);
  draft_model_proposer proposer(draft, echo_vocab);
  const std::vector<int32_t> history = sequence(11, 5);
  EXPECT_EQ(propose_one(proposer, 1, history, 5), echo_continuation(history, 5));
  EXPECT_EQ(proposer.name(), std::string("draft_model"));
}

TEST(draft_model_proposer, rolls_back_to_what_the_verification_kept) {
  kv_echo_model draft(64, 4, echo_vocab);
  draft_model_proposer proposer(draft, echo_vocab);
  std::vector<int32_t> history = sequence(9, 1);
  const std::vector<int32_t> first = propose_one(proposer, 7, history, 6);
  ASSERT_EQ(first, echo_continuation(history, 6));

  // Two drafts accepted, the third rejected: the target's own token follows them. The proposer
  // fed five drafts; the KV of the last three must not leak into the next drafts.
  history.insert(history.end(), first.begin(), first.begin() + 2);
  history.push_back(first[2] == 3 ? 4 : 3);
  kv_echo_model fresh_draft(64, 4, echo_vocab);
  draft_model_proposer fresh(fresh_draft, echo_vocab);
  const std::vector<int32_t> second = propose_one(proposer, 7, history, 6);
  EXPECT_EQ(second, propose_one(fresh, 7, history, 6));
  EXPECT_EQ(second, echo_continuation(history, 6));

  // Everything accepted, then the bonus token; then a history shorter than what was fed (a
  // draft length cut to 1), and one that differs inside the prompt already.
  history.insert(history.end(), second.begin(), second.end());
  history.push_back(5);
  EXPECT_EQ(propose_one(proposer, 7, history, 3), echo_continuation(history, 3));
  EXPECT_EQ(propose_one(proposer, 7, history, 1), echo_continuation(history, 1));
  history[4] = history[4] == 9 ? 10 : 9;
  EXPECT_EQ(propose_one(proposer, 7, history, 4), echo_continuation(history, 4));
  // The same history again: nothing new to feed but its last token.
  EXPECT_EQ(propose_one(proposer, 7, history, 4), echo_continuation(history, 4));
}

TEST(draft_model_proposer, a_batch_of_requests_drafts_as_each_alone) {
  kv_echo_model draft(128, 4, echo_vocab);
  draft_model_proposer proposer(draft, echo_vocab);
  std::vector<std::vector<int32_t>> histories = {sequence(3, 1), sequence(17, 2), sequence(1, 3), sequence(8, 4)};
  const std::vector<int> lengths = {4, 1, 6, 2};
  for (int round = 0; round < 3; ++round) {
    std::vector<draft_request> requests;
    for (size_t i = 0; i < histories.size(); ++i) {
      requests.push_back({static_cast<int64_t>(100 + i), histories[i], lengths[i]});
    }
    const int forwards_before = draft.num_forwards;
    const auto drafts = propose(proposer, requests);
    // One forward per draft position, every request in it.
    EXPECT_EQ(draft.num_forwards - forwards_before, 6);
    ASSERT_EQ(drafts.size(), histories.size());
    for (size_t i = 0; i < histories.size(); ++i) {
      EXPECT_EQ(drafts[i], echo_continuation(histories[i], lengths[i])) << "request " << i << ", round " << round;
      // The next round accepts a different number of drafts per request.
      const size_t accepted = std::min(drafts[i].size(), static_cast<size_t>(round + i) % 3);
      histories[i].insert(histories[i].end(), drafts[i].begin(), drafts[i].begin() + accepted);
      histories[i].push_back(static_cast<int32_t>(3 + (round * 13 + i) % 50));
    }
  }
}

TEST(draft_model_proposer, forget_gives_the_blocks_back) {
  kv_echo_model draft(32, 4, echo_vocab);
  draft_model_proposer proposer(draft, echo_vocab);
  EXPECT_EQ(proposer.num_free_blocks(), 32);
  propose(proposer, {{1, sequence(10, 1), 3}, {2, sequence(21, 2), 4}});
  EXPECT_EQ(proposer.num_requests_held(), 2u);
  EXPECT_EQ(proposer.num_free_blocks(), 32 - 3 - 6);  // 12 and 24 tokens' K/V
  proposer.forget(1);
  EXPECT_EQ(proposer.num_free_blocks(), 32 - 6);
  proposer.forget(2);
  proposer.forget(3);  // unknown: nothing happens
  EXPECT_EQ(proposer.num_free_blocks(), 32);
  EXPECT_EQ(proposer.num_requests_held(), 0u);
}

TEST(draft_model_proposer, refuses_a_draft_of_another_vocabulary) {
  kv_echo_model draft(8, 4, echo_vocab);
  try {
    draft_model_proposer proposer(draft, echo_vocab + 1);
    FAIL() << "a draft of another vocabulary was taken";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 97"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("98"), std::string::npos) << e.what();
  }
}

TEST(draft_model_proposer, a_full_pool_gives_no_drafts_not_an_error) {
  kv_echo_model draft(4, 4, echo_vocab);  // 16 tokens of K/V in all
  draft_model_proposer proposer(draft, echo_vocab);
  const std::vector<int32_t> a = sequence(10, 1);
  const std::vector<int32_t> b = sequence(6, 2);
  auto drafts = propose(proposer, {{1, a, 3}, {2, b, 3}});  // a takes 3 blocks, b would need 2
  EXPECT_EQ(drafts[0], echo_continuation(a, 3));
  EXPECT_TRUE(drafts[1].empty());
  EXPECT_EQ(proposer.num_free_blocks(), 1);
  // Longer than the whole pool: never drafts, holds nothing.
  EXPECT_TRUE(propose_one(proposer, 3, sequence(40, 3), 2).empty());
  EXPECT_EQ(proposer.num_requests_held(), 1u);
  proposer.forget(1);
  EXPECT_EQ(propose(proposer, {{2, b, 3}})[0], echo_continuation(b, 3));
}

TEST(draft_model_proposer, drafts_stay_inside_the_draft_context) {
  kv_echo_model draft(64, 4, echo_vocab);
  draft_model_proposer proposer(draft, echo_vocab, 20);
  // The last draft's input sits at position 19 at most.
  EXPECT_EQ(propose_one(proposer, 1, sequence(17, 1), 8).size(), 4u);
  EXPECT_EQ(propose_one(proposer, 2, sequence(20, 2), 8).size(), 1u);
  EXPECT_TRUE(propose_one(proposer, 3, sequence(21, 3), 8).empty());
  EXPECT_TRUE(propose_one(proposer, 4, {}, 8).empty());
  EXPECT_TRUE(propose_one(proposer, 5, sequence(3, 4), 0).empty());
}

// -- stories260K drafting for itself ------------------------------------------------------------

const std::filesystem::path stories_hf = test::stories260k_dir / "hf";

std::vector<std::vector<int32_t>> stories_prompts() {
  std::ifstream in(test::stories260k_dir / "refs.json");
  const nlohmann::json refs = nlohmann::json::parse(in);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& r : refs.at("references")) {
    prompts.push_back(r.at("input_ids").get<std::vector<int32_t>>());
  }
  return prompts;
}

std::shared_ptr<served_model> load_stories(int num_kv_blocks) {
  model_spec spec;
  spec.path = stories_hf.string();
  spec.num_kv_blocks = num_kv_blocks;
  spec.backend.threads = 1;
  return load_served_model(spec);
}

// The target's plain greedy output for each prompt, from the engine as it serves.
std::vector<std::vector<int32_t>> stories_greedy(const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  std::shared_ptr<served_model> target = load_stories(64);
  engine_config config = target->base_engine_config();
  llm_engine engine(std::move(target->backend_model), config, target->eos_token_ids, 1);
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto added = engine.add_request(prompts[i], testing::greedy(max_tokens));
    EXPECT_TRUE(added.ok());
    index[added.request_id] = i;
  }
  std::vector<std::vector<int32_t>> outputs(prompts.size());
  for (int step = 0; step < 10000 && engine.has_unfinished(); ++step) {
    for (const token_delta& out : engine.step()) {
      auto& ids = outputs[index.at(out.request_id)];
      ids.insert(ids.end(), out.token_ids.begin(), out.token_ids.end());
    }
  }
  return outputs;
}

TEST(draft_model_proposer, stories260k_drafting_for_itself_proposes_the_targets_greedy_output) {
  TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "refs.json");
  const std::vector<std::vector<int32_t>> prompts = stories_prompts();
  constexpr int max_tokens = 40;
  const std::vector<std::vector<int32_t>> greedy = stories_greedy(prompts, max_tokens);
  ASSERT_EQ(greedy.size(), 3u);
  for (const auto& g : greedy) ASSERT_EQ(g.size(), size_t(max_tokens));
  std::shared_ptr<served_model> target = load_stories(8);
  draft_model_proposer proposer(load_stories(64), target->backend_model->config().vocab_size);

  // Every request together, each step accepting everything (the target agrees with itself) and
  // adding its bonus token, with draft lengths that differ per request and step.
  std::vector<size_t> num_outputs(prompts.size(), 1);  // the first token comes from the prefill
  for (int step = 0; step < 12; ++step) {
    std::vector<std::vector<int32_t>> histories(prompts.size());
    std::vector<draft_request> requests;
    for (size_t i = 0; i < prompts.size(); ++i) {
      histories[i] = prompts[i];
      histories[i].insert(histories[i].end(), greedy[i].begin(), greedy[i].begin() + num_outputs[i]);
      const int room = static_cast<int>(greedy[i].size() - num_outputs[i]);
      requests.push_back({static_cast<int64_t>(i), histories[i], std::min(1 + (step + static_cast<int>(i)) % 4, room)});
    }
    std::vector<std::vector<int32_t>> drafts;
    proposer.propose(requests, drafts);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto expected = std::vector<int32_t>(greedy[i].begin() + num_outputs[i],
                                                 greedy[i].begin() + num_outputs[i] + requests[i].max_drafts);
      EXPECT_EQ(drafts[i], expected) << "request " << i << ", step " << step;
      num_outputs[i] = std::min(greedy[i].size(), num_outputs[i] + drafts[i].size() + 1);
    }
  }
  EXPECT_EQ(num_outputs, std::vector<size_t>(prompts.size(), max_tokens));
}

TEST(draft_model_proposer, stories260k_batched_requests_draft_as_each_alone_after_rejections) {
  TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "refs.json");
  const std::vector<std::vector<int32_t>> prompts = stories_prompts();
  draft_model_proposer together(load_stories(64), 512);
  std::vector<std::vector<int32_t>> histories = prompts;
  ASSERT_EQ(histories.size(), 3u);
  for (int step = 0; step < 6; ++step) {
    std::vector<draft_request> requests;
    for (size_t i = 0; i < histories.size(); ++i) requests.push_back({static_cast<int64_t>(i), histories[i], 5});
    std::vector<std::vector<int32_t>> drafts;
    together.propose(requests, drafts);
    for (size_t i = 0; i < histories.size(); ++i) {
      draft_model_proposer alone(load_stories(16), 512);
      EXPECT_EQ(drafts[i], propose_one(alone, 0, histories[i], 5)) << "request " << i << ", step " << step;
      // Accept some, then a token of the target's that the draft did not propose.
      const size_t accepted = (step + i) % 3;
      histories[i].insert(histories[i].end(), drafts[i].begin(), drafts[i].begin() + accepted);
      histories[i].push_back(drafts[i][accepted] == 13 ? 14 : 13);
    }
  }
  for (size_t i = 0; i < histories.size(); ++i) together.forget(static_cast<int64_t>(i));
  EXPECT_EQ(together.num_free_blocks(), together.num_blocks());
}

// The engine's outputs and counters with `draft` (null: no speculation) proposing.
struct engine_outcome {
  std::vector<std::vector<int32_t>> outputs;
  int num_drafts = 0;
  int num_accepted = 0;
  int num_steps = 0;  // sampling steps, summed over requests
};

engine_outcome run_stories(const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                           std::shared_ptr<served_model> draft, int num_speculative_tokens, float temperature = 0.0f) {
  std::shared_ptr<served_model> target = load_stories(64);
  engine_config config = target->base_engine_config();
  config.num_speculative_tokens = num_speculative_tokens;
  llm_engine engine(std::move(target->backend_model), config, target->eos_token_ids, 1);
  if (draft) engine.set_draft_proposer(std::make_unique<draft_model_proposer>(std::move(draft), 512));
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) {
    sampling_params p = testing::greedy(max_tokens);
    p.temperature = temperature;
    p.seed = 1000 + i;
    auto added = engine.add_request(prompts[i], p);
    EXPECT_TRUE(added.ok());
    index[added.request_id] = i;
  }
  engine_outcome outcome;
  outcome.outputs.resize(prompts.size());
  for (int step = 0; step < 10000 && engine.has_unfinished(); ++step) {
    for (const token_delta& out : engine.step()) {
      auto& ids = outcome.outputs[index.at(out.request_id)];
      ids.insert(ids.end(), out.token_ids.begin(), out.token_ids.end());
      if (out.metrics) {
        outcome.num_drafts += out.metrics->num_draft_tokens;
        outcome.num_accepted += out.metrics->num_accepted_tokens;
        outcome.num_steps += out.metrics->num_sampling_steps;
      }
    }
  }
  return outcome;
}

TEST(draft_model_proposer, the_engine_with_a_stories260k_draft_answers_as_without_in_fewer_steps) {
  TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "refs.json");
  std::vector<std::vector<int32_t>> prompts = stories_prompts();
  prompts.push_back({1});
  const engine_outcome plain = run_stories(prompts, 48, nullptr, 0);
  const engine_outcome drafted = run_stories(prompts, 48, load_stories(64), 4);
  EXPECT_EQ(drafted.outputs, plain.outputs);
  // The target drafting for itself: every draft is accepted, so a step yields up to 5 tokens.
  EXPECT_GT(drafted.num_drafts, 0);
  EXPECT_EQ(drafted.num_accepted, drafted.num_drafts);
  EXPECT_LT(drafted.num_steps * 3, plain.num_steps);
}

TEST(draft_model_proposer, the_engine_with_a_random_draft_answers_as_without) {
  TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "refs.json");
  // Random weights of stories260K's shape: wrong nearly every time, so nearly every step rolls
  // the draft back.
  model_spec spec;
  spec.path = (stories_hf / "config.json").string();
  spec.format = load_format::dummy;
  spec.num_kv_blocks = 6;  // too few for all requests at once: some get no drafts
  spec.backend.threads = 1;
  std::shared_ptr<served_model> random = load_draft_model(spec, 512);
  const std::vector<std::vector<int32_t>> prompts = stories_prompts();
  const engine_outcome plain = run_stories(prompts, 40, nullptr, 0);
  const engine_outcome drafted = run_stories(prompts, 40, random, 3);
  EXPECT_EQ(drafted.outputs, plain.outputs);
  EXPECT_GT(drafted.num_drafts, 0);
  EXPECT_LT(drafted.num_accepted, drafted.num_drafts);
}

// A draft is loaded like the target: the loader's copies its backend repacked (a Llama GGUF's
// un-permuted q and k) are freed, so the draft's weights are resident once.
TEST(draft_model_proposer, a_quantized_drafts_repacked_copies_are_freed) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_hf / "config.json");
  testing::scratch_dir dir;
  model_maker_options options;
  options.arch = "llama";
  options.hidden_size = 256;
  options.intermediate_size = 512;
  options.num_layers = 1;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  options.seed = 4;
  options.type = dtype::q4_k;
  options.tokenizer = stories_hf.string();
  options.out = dir.path();
  const made_model made = make_model(options);
  model_spec spec;
  spec.path = made.gguf_path.string();
  spec.num_kv_blocks = 8;
  spec.backend.threads = 1;
  std::shared_ptr<served_model> draft = load_draft_model(spec, made.config.vocab_size);
  if (cpu_weights_not_read(*draft->backend_model).empty()) GTEST_SKIP() << "this CPU's level repacks nothing";
  const weight_tensor* q = draft->loaded.weights.find("model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->data, nullptr) << "the draft's q copy is still held";
}

TEST(draft_model_proposer, a_loaded_draft_of_another_vocabulary_is_refused_naming_it) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_hf / "config.json");
  try {
    draft_model_proposer proposer(load_stories(4), 32000);
    FAIL() << "a draft of another vocabulary was taken";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("stories260K"), std::string::npos) << what;
    EXPECT_NE(what.find("vocab_size 512"), std::string::npos) << what;
    EXPECT_NE(what.find("32000"), std::string::npos) << what;
  }
  model_spec spec;
  spec.path = stories_hf.string();
  try {
    load_draft_model(spec, 32000);
    FAIL() << "a draft of another vocabulary was loaded";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(stories_hf.string() + " has vocab_size 512, the target model 32000"), std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace troupe
