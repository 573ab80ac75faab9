// The one list of a model's tensors: which biases, q/k norms and output projection a config
// implies, and that the loader's expected tensors are exactly that list.

#include <gtest/gtest.h>

#include <set>

#include "model/model_tensors.hpp"

namespace troupe {
namespace {

model_config tiny(architecture arch) {
  model_config c;
  c.arch = arch;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  c.vocab_size = 50;
  return c;
}

std::set<std::string> expected_names(const model_config& c) {
  std::set<std::string> names;
  for (const auto& spec : expected_tensors(c)) EXPECT_TRUE(names.insert(spec.name).second) << spec.name << " twice";
  return names;
}

TEST(model_tensors, the_architecture_implies_biases_and_qk_norms_even_without_the_flag) {
  // A hand-made Qwen2 config without attention_bias: the CPU backend required the biases, the
  // loader did not list them.
  const model_config qwen2 = tiny(architecture::qwen2);
  EXPECT_TRUE(has_attention_bias(qwen2));
  EXPECT_TRUE(expected_names(qwen2).count("model.layers.1.self_attn.k_proj.bias"));
  EXPECT_EQ(tensor_names(qwen2).layers[1].v_bias, "model.layers.1.self_attn.v_proj.bias");
  const model_config qwen3 = tiny(architecture::qwen3);
  EXPECT_TRUE(has_qk_norm(qwen3));
  EXPECT_TRUE(expected_names(qwen3).count("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_EQ(tensor_names(qwen3).layers[0].k_norm, "model.layers.0.self_attn.k_norm.weight");
}

TEST(model_tensors, llama_has_neither_unless_its_config_says) {
  model_config llama = tiny(architecture::llama);
  const model_tensor_names plain = tensor_names(llama);
  EXPECT_TRUE(plain.layers[0].q_bias.empty());
  EXPECT_TRUE(plain.layers[0].q_norm.empty());
  EXPECT_FALSE(expected_names(llama).count("model.layers.0.self_attn.q_proj.bias"));
  llama.attention_bias = true;
  EXPECT_EQ(tensor_names(llama).layers[0].q_bias, "model.layers.0.self_attn.q_proj.bias");
  llama.qk_norm = true;
  EXPECT_EQ(tensor_names(llama).layers[0].q_norm, "model.layers.0.self_attn.q_norm.weight");
}

TEST(model_tensors, tied_embeddings_are_the_output_projection) {
  model_config c = tiny(architecture::llama);
  c.tie_word_embeddings = true;
  EXPECT_EQ(tensor_names(c).lm_head, "model.embed_tokens.weight");
  EXPECT_FALSE(expected_names(c).count("lm_head.weight"));
  c.tie_word_embeddings = false;
  EXPECT_EQ(tensor_names(c).lm_head, "lm_head.weight");
  EXPECT_TRUE(expected_names(c).count("lm_head.weight"));
}

TEST(model_tensors, expected_tensors_are_exactly_the_named_ones) {
  for (architecture arch : {architecture::llama, architecture::mistral, architecture::qwen2, architecture::qwen3}) {
    for (bool tied : {false, true}) {
      model_config c = tiny(arch);
      c.tie_word_embeddings = tied;
      const model_tensor_names n = tensor_names(c);
      std::set<std::string> named = {n.embed_tokens, n.final_norm, n.lm_head};
      for (const auto& l : n.layers) {
        for (const std::string* name : {&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.q_bias, &l.k_bias, &l.v_bias,
                                        &l.q_norm, &l.k_norm, &l.o_proj, &l.post_attention_norm, &l.gate_proj,
                                        &l.up_proj, &l.down_proj}) {
          if (!name->empty()) named.insert(*name);
        }
      }
      EXPECT_EQ(expected_names(c), named) << "architecture " << int(arch) << ", tied " << tied;
    }
  }
}

}  // namespace
}  // namespace troupe
