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

model_config with_experts(architecture arch) {
  model_config c = tiny(arch);
  c.moe.num_experts = 3;
  c.moe.experts_per_token = 2;
  c.moe.expert_intermediate_size = 8;
  if (arch == architecture::qwen2_moe) c.moe.shared_expert_intermediate_size = 24;
  if (arch == architecture::gpt_oss) {
    c.moe.router_bias = c.moe.expert_bias = true;
    c.attention_sinks = true;
  }
  return c;
}

TEST(model_tensors, expected_tensors_are_exactly_the_named_ones) {
  for (architecture arch : {architecture::llama, architecture::mistral, architecture::qwen2, architecture::qwen3,
                            architecture::mixtral, architecture::qwen2_moe, architecture::qwen3_moe,
                            architecture::gpt_oss, architecture::gemma2, architecture::gemma3, architecture::phi3}) {
    for (bool tied : {false, true}) {
      model_config c = with_experts(arch);
      if (arch != architecture::mixtral && arch != architecture::qwen2_moe && arch != architecture::qwen3_moe &&
          arch != architecture::gpt_oss) {
        c.moe = {};
      }
      c.tie_word_embeddings = tied;
      const model_tensor_names n = tensor_names(c);
      std::set<std::string> named = {n.embed_tokens, n.final_norm, n.lm_head};
      for (const auto& l : n.layers) {
        for (const std::string* name :
             {&l.attn_norm,        &l.q_proj,         &l.k_proj,           &l.v_proj,
              &l.q_bias,           &l.k_bias,         &l.v_bias,           &l.q_norm,
              &l.k_norm,           &l.o_proj,         &l.o_bias,           &l.sinks,
              &l.attn_post_norm,   &l.ffn_norm,       &l.ffn_post_norm,    &l.gate_proj,
              &l.up_proj,          &l.down_proj,      &l.router,           &l.router_bias,
              &l.shared_gate_proj, &l.shared_up_proj, &l.shared_down_proj, &l.shared_expert_gate}) {
          if (!name->empty()) named.insert(*name);
        }
        for (const auto& e : l.experts) {
          for (const std::string* name :
               {&e.gate_proj, &e.up_proj, &e.down_proj, &e.gate_bias, &e.up_bias, &e.down_bias}) {
            if (!name->empty()) named.insert(*name);
          }
        }
      }
      EXPECT_EQ(expected_names(c), named) << "architecture " << int(arch) << ", tied " << tied;
    }
  }
}

TEST(model_tensors, each_family_names_its_checkpoint_tensors) {
  const layer_tensor_names mixtral = tensor_names(with_experts(architecture::mixtral)).layers[1];
  EXPECT_EQ(mixtral.router, "model.layers.1.block_sparse_moe.gate.weight");
  EXPECT_EQ(mixtral.experts[2].gate_proj, "model.layers.1.block_sparse_moe.experts.2.w1.weight");
  EXPECT_EQ(mixtral.experts[2].down_proj, "model.layers.1.block_sparse_moe.experts.2.w2.weight");
  EXPECT_EQ(mixtral.experts[2].up_proj, "model.layers.1.block_sparse_moe.experts.2.w3.weight");
  EXPECT_TRUE(mixtral.gate_proj.empty());

  const model_config qwen2_moe = with_experts(architecture::qwen2_moe);
  const layer_tensor_names q2 = tensor_names(qwen2_moe).layers[0];
  EXPECT_EQ(q2.router, "model.layers.0.mlp.gate.weight");
  EXPECT_EQ(q2.experts[1].up_proj, "model.layers.0.mlp.experts.1.up_proj.weight");
  EXPECT_EQ(q2.shared_expert_gate, "model.layers.0.mlp.shared_expert_gate.weight");
  EXPECT_FALSE(q2.q_bias.empty());  // Qwen2's attention
  for (const auto& spec : expected_tensors(qwen2_moe)) {
    if (spec.name == q2.shared_expert_gate) {
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{1, 16}));
    }
    if (spec.name == q2.shared_down_proj) {
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{16, 24}));
    }
    if (spec.name == q2.experts[0].down_proj) {
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{16, 8}));
    }
  }

  const layer_tensor_names oss = tensor_names(with_experts(architecture::gpt_oss)).layers[0];
  EXPECT_EQ(oss.router, "model.layers.0.mlp.router.weight");
  EXPECT_EQ(oss.router_bias, "model.layers.0.mlp.router.bias");
  EXPECT_EQ(oss.experts[0].down_bias, "model.layers.0.mlp.experts.0.down_proj.bias");
  EXPECT_EQ(oss.sinks, "model.layers.0.self_attn.sinks");
  EXPECT_EQ(oss.o_bias, "model.layers.0.self_attn.o_proj.bias");
  EXPECT_EQ(oss.ffn_norm, "model.layers.0.post_attention_layernorm.weight");

  const model_config gemma = tiny(architecture::gemma3);
  const layer_tensor_names g = tensor_names(gemma).layers[0];
  EXPECT_EQ(g.attn_post_norm, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(g.ffn_norm, "model.layers.0.pre_feedforward_layernorm.weight");
  EXPECT_EQ(g.ffn_post_norm, "model.layers.0.post_feedforward_layernorm.weight");
  EXPECT_FALSE(g.q_norm.empty());
  for (const auto& spec : expected_tensors(gemma)) {
    if (spec.name == g.attn_norm || spec.name == g.q_norm) {
      EXPECT_EQ(spec.role, tensor_role::norm_offset) << spec.name;
    }
  }
}

}  // namespace
}  // namespace troupe
