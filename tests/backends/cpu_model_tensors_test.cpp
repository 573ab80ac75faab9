// The CPU backend takes exactly the tensors of the loader's list (model/model_tensors.hpp): a
// tensor the config does not imply is ignored even when the file holds it, and one it implies
// must be there.

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/cpu_model.hpp"
#include "model/loader/dummy_weights.hpp"
#include "tests/backends/cpu_test_support.hpp"

namespace troupe {
namespace {

model_config tiny_llama() {
  model_config c;
  c.arch = architecture::llama;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 64;
  c.max_position_embeddings = 64;
  return c;
}

// Adds an f32 tensor of random values that the store keeps alive.
void add_random(weight_store& store, const std::string& name, std::vector<int64_t> shape, uint32_t seed) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  auto bytes =
      std::make_shared<std::vector<std::byte>>(test::encode(test::random_floats(count, seed, 0.5f), dtype::f32));
  weight_tensor tensor;
  tensor.name = name;
  tensor.type = dtype::f32;
  tensor.shape = std::move(shape);
  tensor.data = bytes->data();
  tensor.num_bytes = bytes->size();
  store.keep_alive(bytes);
  store.add(std::move(tensor));
}

// The logits after a five-token prompt.
std::vector<float> prompt_logits(const model_config& config, const weight_store& weights) {
  auto m = make_cpu_model(config, weights, {8, 4}, 1);
  forward_batch batch;
  for (int t = 0; t < 5; ++t) {
    batch.token_ids.push_back(3 + 7 * t);
    batch.positions.push_back(t);
    batch.slot_mapping.push_back(t);
  }
  batch.query_start = {0, 5};
  batch.context_lengths = {5};
  batch.block_table_start = {0, 8};
  batch.block_tables.resize(8);
  std::iota(batch.block_tables.begin(), batch.block_tables.end(), 0);
  batch.logits_rows = {4};
  std::vector<float> logits(config.vocab_size);
  m->forward(batch, logits.data());
  return logits;
}

TEST(cpu_model_tensors, tied_embeddings_win_over_an_lm_head_in_the_file) {
  model_config config = tiny_llama();
  config.tie_word_embeddings = true;
  const weight_store plain = make_dummy_weights(config, dtype::f32, 5, {0.1f, 0.1f});
  weight_store with_head = plain;
  add_random(with_head, "lm_head.weight", {config.vocab_size, config.hidden_size}, 11);
  EXPECT_EQ(prompt_logits(config, with_head), prompt_logits(config, plain));
}

TEST(cpu_model_tensors, biases_and_qk_norms_the_config_does_not_imply_are_ignored) {
  const model_config config = tiny_llama();
  const weight_store plain = make_dummy_weights(config, dtype::f32, 5, {0.1f, 0.1f});
  weight_store extra = plain;
  const int64_t q_dim = int64_t{config.num_heads} * config.head_dim,
                kv_dim = int64_t{config.num_kv_heads} * config.head_dim;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
    add_random(extra, p + "q_proj.bias", {q_dim}, 20 + layer);
    add_random(extra, p + "k_proj.bias", {kv_dim}, 30 + layer);
    add_random(extra, p + "v_proj.bias", {kv_dim}, 40 + layer);
    add_random(extra, p + "q_norm.weight", {config.head_dim}, 50 + layer);
    add_random(extra, p + "k_norm.weight", {config.head_dim}, 60 + layer);
  }
  EXPECT_EQ(prompt_logits(config, extra), prompt_logits(config, plain));
}

TEST(cpu_model_tensors, an_untied_model_without_lm_head_is_refused_naming_it) {
  model_config tied = tiny_llama();
  tied.tie_word_embeddings = true;
  const weight_store no_head = make_dummy_weights(tied, dtype::f32, 5);
  model_config untied = tiny_llama();
  untied.tie_word_embeddings = false;
  try {
    make_cpu_model(untied, no_head, {8, 4}, 1);
    FAIL() << "an untied model without lm_head.weight was built";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe
