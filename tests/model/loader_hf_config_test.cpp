#include <gtest/gtest.h>

#include <cmath>

#include "model/architecture.hpp"
#include "model/loader/hf_config.hpp"
#include "tests/model/loader_test_util.hpp"

namespace troupe {
namespace {

using nlohmann::json;
using testing::expect_error;

json llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"hidden_size", 64},
          {"intermediate_size", 172},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 8},
          {"num_key_value_heads", 4},
          {"vocab_size", 512},
          {"max_position_embeddings", 512},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", true},
          {"bos_token_id", 1},
          {"eos_token_id", 2}};
}

TEST(loader_hf_config, reads_stories260k) {
  model_config config = load_hf_config(testing::shared_model_dir() / "hf");
  EXPECT_EQ(config.arch, architecture::llama);
  EXPECT_EQ(config.architecture_name, "LlamaForCausalLM");
  EXPECT_EQ(config.hidden_size, 64);
  EXPECT_EQ(config.intermediate_size, 172);
  EXPECT_EQ(config.num_layers, 5);
  EXPECT_EQ(config.num_heads, 8);
  EXPECT_EQ(config.num_kv_heads, 4);
  EXPECT_EQ(config.head_dim, 8);
  EXPECT_EQ(config.vocab_size, 512);
  EXPECT_FLOAT_EQ(config.rms_norm_eps, 1e-5f);
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_FALSE(config.rope_scaling.has_value());
  EXPECT_EQ(config.bos_token_id, 1);
  EXPECT_EQ(config.eos_token_ids, std::vector<int>{2});
}

TEST(loader_hf_config, llama3_rope_scaling_and_eos_list_merged_with_generation_config) {
  json config = llama_config();
  config["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 32.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 8192}};
  config["eos_token_id"] = {128001, 128008};
  json generation = {{"eos_token_id", {128001, 128009}}};
  model_config parsed = parse_hf_config(config, generation);
  ASSERT_TRUE(parsed.rope_scaling.has_value());
  EXPECT_FLOAT_EQ(parsed.rope_scaling->factor, 32.0f);
  EXPECT_EQ(parsed.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(parsed.eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  // Older files spell the key "type".
  config["rope_scaling"] = {{"type", "llama3"}, {"factor", 8.0}};
  EXPECT_FLOAT_EQ(parse_hf_config(config).rope_scaling->factor, 8.0f);
}

TEST(loader_hf_config, rejects_unknown_rope_scaling_types) {
  json config = llama_config();
  config["rope_scaling"] = {{"type", "ntk-by-parts"}, {"factor", 4.0}};
  expect_error([&] { parse_hf_config(config); }, {"rope_scaling", "ntk-by-parts", "yarn", "longrope"});
}

TEST(loader_hf_config, rope_scaling_types_of_the_families) {
  json config = llama_config();
  config["architectures"] = {"Qwen2ForCausalLM"};
  config["max_position_embeddings"] = 32768;
  // Qwen2.5's recipe for long contexts.
  config["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  rope_scaling_config yarn = *parse_hf_config(config).rope_scaling;
  EXPECT_EQ(yarn.type, rope_scaling_type::yarn);
  EXPECT_FLOAT_EQ(yarn.factor, 4.0f);
  EXPECT_EQ(yarn.original_max_position_embeddings, 32768);
  EXPECT_TRUE(yarn.truncate);
  EXPECT_FLOAT_EQ(yarn.beta_fast, 32.0f);
  config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(parse_hf_config(config).rope_scaling->type, rope_scaling_type::linear);
  EXPECT_EQ(parse_hf_config(config).rope_scaling->original_max_position_embeddings,
            32768);  // the context it was trained at
  config["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  EXPECT_EQ(parse_hf_config(config).rope_scaling->type, rope_scaling_type::dynamic);
  config["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_FALSE(parse_hf_config(config).rope_scaling.has_value());
  config["rope_scaling"] = {{"type", "linear"}, {"factor", -2.0}};
  expect_error([&] { parse_hf_config(config); }, {"factor"});
}

json mixtral_config() {
  return {{"architectures", {"MixtralForCausalLM"}},
          {"hidden_size", 4096},
          {"intermediate_size", 14336},
          {"num_local_experts", 8},
          {"num_experts_per_tok", 2},
          {"num_hidden_layers", 32},
          {"num_attention_heads", 32},
          {"num_key_value_heads", 8},
          {"max_position_embeddings", 32768},
          {"rope_theta", 1e6},
          {"sliding_window", nullptr},
          {"vocab_size", 32000},
          {"rms_norm_eps", 1e-5}};
}

TEST(loader_hf_config, mixture_of_experts_families) {
  model_config mixtral = parse_hf_config(mixtral_config());
  EXPECT_EQ(mixtral.arch, architecture::mixtral);
  EXPECT_EQ(mixtral.moe.num_experts, 8);
  EXPECT_EQ(mixtral.moe.experts_per_token, 2);
  EXPECT_EQ(mixtral.moe.expert_intermediate_size, 14336);
  EXPECT_TRUE(mixtral.moe.norm_topk_prob);  // Mixtral always renormalises
  EXPECT_EQ(mixtral.moe.scoring, router_scoring::softmax);

  // Qwen3-30B-A3B's config.json.
  json qwen3 = {{"architectures", {"Qwen3MoeForCausalLM"}},
                {"hidden_size", 2048},
                {"intermediate_size", 6144},
                {"moe_intermediate_size", 768},
                {"num_experts", 128},
                {"num_experts_per_tok", 8},
                {"norm_topk_prob", true},
                {"num_hidden_layers", 48},
                {"num_attention_heads", 32},
                {"num_key_value_heads", 4},
                {"head_dim", 128},
                {"vocab_size", 151936},
                {"max_position_embeddings", 40960},
                {"rope_theta", 1000000},
                {"decoder_sparse_step", 1},
                {"mlp_only_layers", json::array()},
                {"sliding_window", nullptr},
                {"use_sliding_window", false}};
  model_config q3 = parse_hf_config(qwen3);
  EXPECT_EQ(q3.arch, architecture::qwen3_moe);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_EQ(q3.moe.num_experts, 128);
  EXPECT_EQ(q3.moe.expert_intermediate_size, 768);
  EXPECT_TRUE(q3.moe.norm_topk_prob);
  EXPECT_EQ(q3.moe.shared_expert_intermediate_size, 0);
  qwen3["mlp_only_layers"] = {0, 1};
  expect_error([&] { parse_hf_config(qwen3); }, {"mlp_only_layers"});
  qwen3["mlp_only_layers"] = json::array();
  qwen3["num_experts_per_tok"] = 129;
  expect_error([&] { parse_hf_config(qwen3); }, {"num_experts_per_tok", "129"});

  // Qwen1.5-MoE-A2.7B: a shared expert, no renormalisation, qkv bias.
  json qwen2 = {{"architectures", {"Qwen2MoeForCausalLM"}},
                {"hidden_size", 2048},
                {"intermediate_size", 5632},
                {"moe_intermediate_size", 1408},
                {"shared_expert_intermediate_size", 5632},
                {"num_experts", 60},
                {"num_experts_per_tok", 4},
                {"norm_topk_prob", false},
                {"num_hidden_layers", 24},
                {"num_attention_heads", 16},
                {"num_key_value_heads", 16},
                {"vocab_size", 151936},
                {"max_position_embeddings", 8192}};
  model_config q2 = parse_hf_config(qwen2);
  EXPECT_EQ(q2.arch, architecture::qwen2_moe);
  EXPECT_TRUE(q2.attention_bias);
  EXPECT_FALSE(q2.moe.norm_topk_prob);
  EXPECT_EQ(q2.moe.shared_expert_intermediate_size, 5632);
  qwen2.erase("shared_expert_intermediate_size");
  expect_error([&] { parse_hf_config(qwen2); }, {"shared_expert_intermediate_size"});
}

TEST(loader_hf_config, gpt_oss) {
  json layer_types = json::array();
  for (int i = 0; i < 24; ++i) layer_types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  json config = {{"architectures", {"GptOssForCausalLM"}},
                 {"hidden_size", 2880},
                 {"intermediate_size", 2880},
                 {"num_local_experts", 32},
                 {"num_experts_per_tok", 4},
                 {"experts_per_token", 4},
                 {"num_hidden_layers", 24},
                 {"num_attention_heads", 64},
                 {"num_key_value_heads", 8},
                 {"head_dim", 64},
                 {"vocab_size", 201088},
                 {"max_position_embeddings", 131072},
                 {"rope_theta", 150000},
                 {"sliding_window", 128},
                 {"layer_types", layer_types},
                 {"swiglu_limit", 7.0},
                 {"attention_bias", true},
                 {"tie_word_embeddings", false},
                 {"rms_norm_eps", 1e-5},
                 {"hidden_act", "silu"},
                 {"rope_scaling",
                  {{"beta_fast", 32.0},
                   {"beta_slow", 1.0},
                   {"factor", 32.0},
                   {"original_max_position_embeddings", 4096},
                   {"rope_type", "yarn"},
                   {"truncate", false}}}};
  model_config c = parse_hf_config(config);
  EXPECT_EQ(c.arch, architecture::gpt_oss);
  EXPECT_EQ(c.moe.scoring, router_scoring::softmax_over_top_k);
  EXPECT_TRUE(c.moe.router_bias && c.moe.expert_bias && c.attention_sinks && c.attention_bias);
  EXPECT_EQ(c.moe.expert_intermediate_size, 2880);
  EXPECT_EQ(c.activation, activation_kind::swiglu_oai);
  EXPECT_FLOAT_EQ(c.swiglu_limit, 7.0f);
  EXPECT_FALSE(c.rope_scaling->truncate);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 4096);
  ASSERT_EQ(c.sliding_layers.size(), 24u);
  EXPECT_TRUE(c.sliding_layers[0]);
  EXPECT_FALSE(c.sliding_layers[1]);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_EQ(c.max_position_embeddings, 131072);  // the window is attention's, not the context's
  EXPECT_EQ(attention_reach(c), 0);              // full layers read the whole context
  layer_types[3] = "chunked_attention";
  config["layer_types"] = layer_types;
  expect_error([&] { parse_hf_config(config); }, {"layer_types[3]", "chunked_attention"});
}

TEST(loader_hf_config, gemma2_and_gemma3) {
  json gemma2 = {{"architectures", {"Gemma2ForCausalLM"}},
                 {"hidden_size", 2304},
                 {"intermediate_size", 9216},
                 {"num_hidden_layers", 26},
                 {"num_attention_heads", 8},
                 {"num_key_value_heads", 4},
                 {"head_dim", 256},
                 {"query_pre_attn_scalar", 256},
                 {"attn_logit_softcapping", 50.0},
                 {"final_logit_softcapping", 30.0},
                 {"sliding_window", 4096},
                 {"hidden_activation", "gelu_pytorch_tanh"},
                 {"vocab_size", 256000},
                 {"max_position_embeddings", 8192},
                 {"rope_theta", 10000}};
  model_config g2 = parse_hf_config(gemma2);
  EXPECT_EQ(g2.arch, architecture::gemma2);
  EXPECT_EQ(g2.activation, activation_kind::gelu_tanh);
  EXPECT_FLOAT_EQ(g2.attn_logit_softcapping, 50.0f);
  EXPECT_FLOAT_EQ(g2.final_logit_softcapping, 30.0f);
  EXPECT_FLOAT_EQ(g2.query_pre_attn_scalar, 256.0f);
  EXPECT_TRUE(g2.tie_word_embeddings);  // Gemma's default
  ASSERT_EQ(g2.sliding_layers.size(), 26u);
  EXPECT_TRUE(g2.sliding_layers[0]);
  EXPECT_FALSE(g2.sliding_layers[1]);
  gemma2["hidden_activation"] = "relu";
  expect_error([&] { parse_hf_config(gemma2); }, {"relu", "gelu_pytorch_tanh"});

  json gemma3 = {{"architectures", {"Gemma3ForCausalLM"}},
                 {"hidden_size", 1152},
                 {"intermediate_size", 6912},
                 {"num_hidden_layers", 26},
                 {"num_attention_heads", 4},
                 {"num_key_value_heads", 1},
                 {"head_dim", 256},
                 {"query_pre_attn_scalar", 256},
                 {"sliding_window", 512},
                 {"sliding_window_pattern", 6},
                 {"rope_local_base_freq", 10000},
                 {"rope_theta", 1000000},
                 {"rope_scaling", nullptr},
                 {"final_logit_softcapping", nullptr},
                 {"attn_logit_softcapping", nullptr},
                 {"vocab_size", 262144},
                 {"max_position_embeddings", 32768},
                 {"hidden_activation", "gelu_pytorch_tanh"}};
  model_config g3 = parse_hf_config(gemma3);
  EXPECT_EQ(g3.arch, architecture::gemma3);
  EXPECT_TRUE(g3.qk_norm);
  EXPECT_EQ(g3.attn_logit_softcapping, 0.0f);
  EXPECT_EQ(g3.final_logit_softcapping, 0.0f);
  EXPECT_FLOAT_EQ(g3.rope_local_theta, 10000.0f);
  for (int i = 0; i < 26; ++i) EXPECT_EQ(g3.sliding_layers[i], (i + 1) % 6 != 0) << i;
}

TEST(loader_hf_config, phi3_longrope_and_partial_rotary) {
  json short_factor = json::array(), long_factor = json::array();
  for (int i = 0; i < 48; ++i) {
    short_factor.push_back(1.0 + 0.01 * i);
    long_factor.push_back(1.0 + 0.5 * i);
  }
  // Phi-4-mini: 3/4 of each 128-wide head rotates.
  json config = {
      {"architectures", {"Phi3ForCausalLM"}},
      {"hidden_size", 3072},
      {"intermediate_size", 8192},
      {"num_hidden_layers", 32},
      {"num_attention_heads", 24},
      {"num_key_value_heads", 8},
      {"max_position_embeddings", 131072},
      {"original_max_position_embeddings", 4096},
      {"partial_rotary_factor", 0.75},
      {"rope_theta", 10000},
      {"vocab_size", 200064},
      {"hidden_act", "silu"},
      {"rope_scaling", {{"type", "longrope"}, {"short_factor", short_factor}, {"long_factor", long_factor}}}};
  model_config c = parse_hf_config(config);
  EXPECT_EQ(c.arch, architecture::phi3);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 96);
  EXPECT_EQ(c.rope_scaling->type, rope_scaling_type::longrope);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 4096);
  EXPECT_NEAR(c.rope_scaling->attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-6);
  EXPECT_EQ(c.rope_scaling->long_factor.size(), 48u);
  config["partial_rotary_factor"] = 0.2;  // 25 dimensions: odd
  expect_error([&] { parse_hf_config(config); }, {"partial_rotary_factor"});
  config["partial_rotary_factor"] = 0.75;
  config["rope_scaling"].erase("long_factor");
  expect_error([&] { parse_hf_config(config); }, {"long_factor"});
}

// Sliding windows are attention's (the CPU kernels apply them per layer): the context stays the
// model's, and the window applies only where the family uses it.
TEST(loader_hf_config, a_sliding_window_applies_where_the_family_uses_it) {
  json config = llama_config();
  config["architectures"] = {"MistralForCausalLM"};
  config["max_position_embeddings"] = 32768;
  config["sliding_window"] = 4096;
  model_config c = parse_hf_config(config);
  EXPECT_EQ(c.max_position_embeddings, 32768);  // no longer capped to the window
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.sliding_layers, std::vector<bool>(c.num_layers, true));  // Mistral v0.1: every layer
  config["sliding_window"] = nullptr;                                  // Mistral v0.2+: no window
  EXPECT_EQ(parse_hf_config(config).sliding_window, 0);

  config["architectures"] = {"Qwen2ForCausalLM"};
  config["sliding_window"] = 4096;
  EXPECT_EQ(parse_hf_config(config).sliding_window, 0);  // use_sliding_window absent: off
  config["use_sliding_window"] = true;
  EXPECT_EQ(parse_hf_config(config).sliding_window, 4096);

  config["architectures"] = {"MistralForCausalLM"};
  config["sliding_window"] = "wide";
  expect_error([&] { parse_hf_config(config); }, {"sliding_window"});
}

TEST(loader_hf_config, unknown_architecture_names_it_and_the_supported_ones) {
  json config = llama_config();
  config["architectures"] = {"GPTNeoXForCausalLM"};
  expect_error([&] { parse_hf_config(config); }, {"GPTNeoXForCausalLM", "LlamaForCausalLM", "Qwen3MoeForCausalLM",
                                                  "GptOssForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM"});
}

TEST(loader_hf_config, missing_field_and_missing_file_are_named) {
  json config = llama_config();
  config.erase("hidden_size");
  expect_error([&] { parse_hf_config(config); }, {"hidden_size"});
  testing::scratch_dir dir;
  expect_error([&] { load_hf_config(dir.path()); }, {"config.json", dir.path().string()});
}

// Values out of range are named, not narrowed or defaulted (issue 25: a context of 0, -5 or 1e12
// served at 4096; rope_theta 0 or rms_norm_eps -1 loaded and produced token 0 forever).
TEST(loader_hf_config, out_of_range_numbers_are_refused_by_name) {
  const auto refused = [](const char* key, json value, std::initializer_list<std::string> parts) {
    SCOPED_TRACE(std::string(key) + " = " + value.dump());
    json config = llama_config();
    config[key] = value;
    expect_error([&] { parse_hf_config(config); }, parts);
  };
  refused("max_position_embeddings", 0, {"max_position_embeddings", "0"});
  refused("max_position_embeddings", -5, {"max_position_embeddings", "-5"});
  refused("max_position_embeddings", 1e12, {"max_position_embeddings", "non-integer"});
  refused("max_position_embeddings", int64_t(1) << 40, {"max_position_embeddings", "1099511627776"});
  refused("rope_theta", 0, {"rope_theta", "is 0"});
  refused("rope_theta", -10000.0, {"rope_theta"});
  refused("rope_theta", 1e300, {"rope_theta"});
  refused("rope_theta", "10000", {"rope_theta", "a number"});
  refused("rms_norm_eps", -1, {"rms_norm_eps", "-1"});
  refused("rms_norm_eps", 0, {"rms_norm_eps"});
  refused("rms_norm_eps", 2, {"rms_norm_eps"});
  json config = llama_config();
  config.erase("max_position_embeddings");
  config.erase("rope_theta");
  config["rms_norm_eps"] = nullptr;
  const model_config defaults = parse_hf_config(config);
  EXPECT_EQ(defaults.max_position_embeddings, 2048);
  EXPECT_FLOAT_EQ(defaults.rope_theta, 10000.0f);
  EXPECT_FLOAT_EQ(defaults.rms_norm_eps, 1e-6f);
}

TEST(loader_hf_config, round_trips_through_to_hf_config) {
  json config = llama_config();
  config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  model_config parsed = parse_hf_config(config);
  model_config again = parse_hf_config(to_hf_config(parsed));
  EXPECT_EQ(again.hidden_size, parsed.hidden_size);
  EXPECT_EQ(again.head_dim, parsed.head_dim);
  EXPECT_EQ(again.eos_token_ids, parsed.eos_token_ids);
  EXPECT_FLOAT_EQ(again.rope_scaling->factor, 8.0f);
  EXPECT_EQ(again.tie_word_embeddings, parsed.tie_word_embeddings);
}

}  // namespace
}  // namespace troupe
