#include <gtest/gtest.h>

#include "model/loader/hf_config.hpp"
#include "tests/model/loader_test_util.hpp"

namespace troupe {
namespace {

using nlohmann::json;
using testing::expect_error;

json llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", 64}, {"intermediate_size", 172},
          {"num_hidden_layers", 2}, {"num_attention_heads", 8}, {"num_key_value_heads", 4},
          {"vocab_size", 512}, {"max_position_embeddings", 512}, {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0}, {"tie_word_embeddings", true}, {"bos_token_id", 1}, {"eos_token_id", 2}};
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
  config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
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

TEST(loader_hf_config, rejects_other_rope_scaling_types) {
  json config = llama_config();
  config["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  expect_error([&] { parse_hf_config(config); }, {"rope_scaling", "yarn"});
}

TEST(loader_hf_config, qwen2_has_bias_qwen3_has_qk_norm_and_explicit_head_dim) {
  json config = llama_config();
  config["architectures"] = {"Qwen2ForCausalLM"};
  config["tie_word_embeddings"] = false;
  model_config qwen2 = parse_hf_config(config);
  EXPECT_EQ(qwen2.arch, architecture::qwen2);
  EXPECT_TRUE(qwen2.attention_bias);
  EXPECT_FALSE(qwen2.qk_norm);
  EXPECT_FALSE(qwen2.tie_word_embeddings);

  config["architectures"] = {"Qwen3ForCausalLM"};
  config["head_dim"] = 16;  // not hidden_size / heads
  model_config qwen3 = parse_hf_config(config);
  EXPECT_EQ(qwen3.arch, architecture::qwen3);
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_FALSE(qwen3.attention_bias);
  EXPECT_EQ(qwen3.head_dim, 16);

  config["architectures"] = {"MistralForCausalLM"};
  config.erase("head_dim");
  config.erase("num_key_value_heads");  // defaults to num_attention_heads
  model_config mistral = parse_hf_config(config);
  EXPECT_EQ(mistral.arch, architecture::mistral);
  EXPECT_EQ(mistral.num_kv_heads, 8);
  EXPECT_EQ(mistral.head_dim, 8);
}

// Sliding-window attention is not implemented: a window shorter than the context caps it.
TEST(loader_hf_config, a_sliding_window_caps_the_context_where_it_applies) {
  json config = llama_config();
  config["architectures"] = {"MistralForCausalLM"};
  config["max_position_embeddings"] = 32768;
  config["sliding_window"] = 4096;
  EXPECT_EQ(parse_hf_config(config).max_position_embeddings, 4096);
  config["sliding_window"] = nullptr;  // Mistral v0.2+: no window
  EXPECT_EQ(parse_hf_config(config).max_position_embeddings, 32768);
  config["sliding_window"] = 65536;  // wider than the context: nothing to cap
  EXPECT_EQ(parse_hf_config(config).max_position_embeddings, 32768);

  config["architectures"] = {"Qwen2ForCausalLM"};
  config["sliding_window"] = 4096;
  EXPECT_EQ(parse_hf_config(config).max_position_embeddings, 32768);  // use_sliding_window absent: off
  config["use_sliding_window"] = true;
  EXPECT_EQ(parse_hf_config(config).max_position_embeddings, 4096);

  config["architectures"] = {"MistralForCausalLM"};
  config["sliding_window"] = "wide";
  expect_error([&] { parse_hf_config(config); }, {"sliding_window"});
}

TEST(loader_hf_config, unknown_architecture_names_it_and_the_supported_ones) {
  json config = llama_config();
  config["architectures"] = {"GPTNeoXForCausalLM"};
  expect_error([&] { parse_hf_config(config); }, {"GPTNeoXForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM"});
}

TEST(loader_hf_config, missing_field_and_missing_file_are_named) {
  json config = llama_config();
  config.erase("hidden_size");
  expect_error([&] { parse_hf_config(config); }, {"hidden_size"});
  testing::scratch_dir dir;
  expect_error([&] { load_hf_config(dir.path()); }, {"config.json", dir.path().string()});
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
