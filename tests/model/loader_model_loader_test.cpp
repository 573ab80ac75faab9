#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "model/loader/float_conversion.hpp"
#include "model/loader/hf_config.hpp"
#include "model/loader/dummy_weights.hpp"
#include "model/loader/model_loader.hpp"
#include "model/loader/safetensors_file.hpp"
#include "model/loader/safetensors_writer.hpp"
#include "model/model_tensors.hpp"
#include "model/weight_finiteness.hpp"
#include "tests/model/loader_test_util.hpp"

namespace troupe {
namespace {

using testing::expect_error;

std::vector<weight_tensor> sorted_tensors(const weight_store& store) {
  std::vector<weight_tensor> tensors;
  for (const auto& [name, tensor] : store.tensors()) tensors.push_back(tensor);
  return tensors;
}

void copy_configs(const std::filesystem::path& to) {
  for (const char* name : {"config.json", "generation_config.json"}) {
    std::filesystem::copy_file(testing::shared_model_dir() / "hf" / name, to / name);
  }
}

TEST(loader_model_loader, sharded_round_trip_equals_single_file) {
  testing::scratch_dir dir;
  loaded_model single = load_model({testing::shared_model_dir() / "hf"});
  const int shards = write_sharded_safetensors(dir.path(), sorted_tensors(single.weights), 300'000);
  EXPECT_GE(shards, 3);
  copy_configs(dir.path());
  loaded_model sharded = load_model({dir.path()});
  ASSERT_EQ(sharded.weights.tensors().size(), single.weights.tensors().size());
  for (const auto& [name, tensor] : single.weights.tensors()) {
    const weight_tensor& other = sharded.weights.get(name);
    EXPECT_EQ(other.shape, tensor.shape);
    EXPECT_EQ(std::memcmp(other.data, tensor.data, tensor.num_bytes), 0) << name;
  }
  // A shard that went missing is named.
  std::filesystem::remove(dir / ("model-00002-of-0000" + std::to_string(shards) + ".safetensors"));
  expect_error([&] { load_model({dir.path()}); }, {"model-00002-of-", "does not exist"});
}

TEST(loader_model_loader, shape_mismatch_names_tensor_and_both_shapes) {
  testing::scratch_dir dir;
  loaded_model model = load_model({testing::shared_model_dir() / "hf"});
  std::vector<weight_tensor> tensors = sorted_tensors(model.weights);
  std::vector<float> wrong(64 * 16, 0.0f);
  for (auto& t : tensors) {
    if (t.name == "model.layers.2.self_attn.k_proj.weight") {
      t.shape = {16, 64};
      t.data = reinterpret_cast<const std::byte*>(wrong.data());
      t.num_bytes = wrong.size() * 4;
    }
  }
  write_safetensors(dir / "model.safetensors", tensors);
  copy_configs(dir.path());
  expect_error(
      [&] { load_model({dir.path()}); },
      {"tensor model.layers.2.self_attn.k_proj.weight has shape [16,64], expected [32,64] from", "config.json"});
}

TEST(loader_model_loader, missing_tensor_and_missing_weights_are_named) {
  testing::scratch_dir dir;
  copy_configs(dir.path());
  expect_error([&] { load_model({dir.path()}); }, {dir.path().string(), "model.safetensors"});
  loaded_model model = load_model({testing::shared_model_dir() / "hf"});
  std::vector<weight_tensor> tensors;
  for (const auto& t : sorted_tensors(model.weights)) {
    if (t.name != "model.norm.weight") tensors.push_back(t);
  }
  write_safetensors(dir / "model.safetensors", tensors);
  expect_error([&] { load_model({dir.path()}); }, {"model.norm.weight", "missing"});
  expect_error([&] { load_model({dir / "nothing_here"}); }, {"nothing_here", "does not exist"});
}

// A NaN or infinite weight is refused at load, naming the tensor and where in it (issue 25): it
// loaded before and every logit became NaN, so the model answered token 0 forever.
TEST(loader_model_loader, a_nan_or_infinite_weight_is_refused_naming_the_tensor_and_element) {
  testing::scratch_dir dir;
  loaded_model model = load_model({testing::shared_model_dir() / "hf"});
  std::vector<weight_tensor> tensors = sorted_tensors(model.weights);
  std::vector<float> poisoned;
  for (auto& t : tensors) {
    if (t.name != "model.layers.1.mlp.up_proj.weight") continue;
    ASSERT_EQ(t.type, dtype::f32);
    poisoned.assign(reinterpret_cast<const float*>(t.data), reinterpret_cast<const float*>(t.data) + t.num_bytes / 4);
    poisoned[3 * t.cols() + 5] = std::nanf("");
    t.data = reinterpret_cast<const std::byte*>(poisoned.data());
  }
  ASSERT_FALSE(poisoned.empty());
  write_safetensors(dir / "model.safetensors", tensors);
  copy_configs(dir.path());
  expect_error([&] { load_model({dir.path()}); },
               {"tensor model.layers.1.mlp.up_proj.weight", "NaN or infinite", "row 3, column 5"});
}

TEST(loader_model_loader, non_finite_values_are_found_in_every_float_type) {
  auto tensor_of = [](dtype type, const void* data, size_t bytes, int64_t count) {
    weight_tensor t;
    t.type = type;
    t.shape = {count};
    t.data = static_cast<const std::byte*>(data);
    t.num_bytes = bytes;
    return t;
  };
  std::vector<float> f32(10000, 1.5f);
  EXPECT_FALSE(first_non_finite(tensor_of(dtype::f32, f32.data(), f32.size() * 4, 10000)));
  f32[9000] = -INFINITY;
  EXPECT_EQ(first_non_finite(tensor_of(dtype::f32, f32.data(), f32.size() * 4, 10000)), 9000);
  f32[9000] = 3.0e38f;  // large but finite
  EXPECT_FALSE(first_non_finite(tensor_of(dtype::f32, f32.data(), f32.size() * 4, 10000)));
  std::vector<uint16_t> half(5000, 0x3c00);  // f16 1.0
  half[4999] = 0x7bff;                       // f16's largest finite
  EXPECT_FALSE(first_non_finite(tensor_of(dtype::f16, half.data(), half.size() * 2, 5000)));
  half[17] = 0xfc00;  // -inf
  EXPECT_EQ(first_non_finite(tensor_of(dtype::f16, half.data(), half.size() * 2, 5000)), 17);
  std::vector<uint16_t> bf(300, 0x3f80);  // bf16 1.0
  bf[299] = 0x7fc1;                       // a NaN
  EXPECT_EQ(first_non_finite(tensor_of(dtype::bf16, bf.data(), bf.size() * 2, 300)), 299);
  EXPECT_FALSE(first_non_finite(tensor_of(dtype::q8_0, bf.data(), 34, 32))) << "quantized types are checked elsewhere";
  // Attention sinks may be -inf (no weight), never NaN or +inf.
  std::vector<float> sinks(8, -INFINITY);
  EXPECT_FALSE(first_non_finite(tensor_of(dtype::f32, sinks.data(), 32, 8), /*allow_negative_infinity=*/true));
  EXPECT_EQ(first_non_finite(tensor_of(dtype::f32, sinks.data(), 32, 8)), 0);
  sinks[6] = INFINITY;
  EXPECT_EQ(first_non_finite(tensor_of(dtype::f32, sinks.data(), 32, 8), true), 6);
}

TEST(loader_model_loader, dummy_weights_have_the_config_shapes_and_are_deterministic) {
  // A Qwen3-shaped config with GQA, biases off, q/k norms on, untied.
  testing::scratch_dir dir;
  model_config config;
  config.arch = architecture::qwen3;
  config.architecture_name = "Qwen3ForCausalLM";
  config.hidden_size = 64;
  config.intermediate_size = 96;
  config.num_layers = 2;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 32;
  config.vocab_size = 100;
  config.max_position_embeddings = 128;
  config.qk_norm = true;
  testing::write_text(dir / "config.json", to_hf_config(config).dump());

  load_options options{dir / "config.json", load_format::dummy, dtype::bf16, 7, false};
  loaded_model a = load_model(options);
  loaded_model b = load_model(options);
  options.dummy_seed = 8;
  loaded_model c = load_model(options);
  validate_weights(a.config, a.weights, "test");
  EXPECT_EQ(a.weights.get("model.layers.1.self_attn.q_proj.weight").shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(a.weights.get("model.layers.1.self_attn.q_norm.weight").shape, (std::vector<int64_t>{32}));
  EXPECT_EQ(a.weights.get("lm_head.weight").type, dtype::bf16);
  const weight_tensor& wa = a.weights.get("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(std::memcmp(wa.data, b.weights.get(wa.name).data, wa.num_bytes), 0);
  EXPECT_NE(std::memcmp(wa.data, c.weights.get(wa.name).data, wa.num_bytes), 0);
  // Small normal values: mean ~0, standard deviation ~0.02; norms exactly 1.
  std::vector<float> values(wa.num_elements());
  convert_to_f32(wa.data, dtype::bf16, values);
  double sum = 0, sum_sq = 0;
  for (float v : values) {
    sum += v;
    sum_sq += double(v) * v;
  }
  const double mean = sum / values.size();
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(sum_sq / values.size() - mean * mean), 0.02, 0.002);
  std::vector<float> norm(64);
  convert_to_f32(a.weights.get("model.norm.weight").data, dtype::bf16, norm);
  for (float v : norm) EXPECT_EQ(v, 1.0f);
}

// Issue 25: a dummy load of absurd sizes ran 35 s and ended in a bare std::bad_alloc. The bytes
// are computed from the config before anything is allocated, and the refusal names them.
TEST(loader_model_loader, dummy_weights_too_big_for_memory_are_refused_naming_the_sizes) {
  testing::scratch_dir dir;
  model_config config;
  config.arch = architecture::llama;
  config.architecture_name = "LlamaForCausalLM";
  config.hidden_size = 1 << 20;
  config.intermediate_size = 1 << 22;
  config.num_layers = 1000;
  config.num_heads = 1 << 12;
  config.num_kv_heads = 1 << 12;
  config.head_dim = 256;
  config.vocab_size = 1 << 20;
  config.max_position_embeddings = 128;
  testing::write_text(dir / "config.json", to_hf_config(config).dump());
  const dummy_weight_bytes need = dummy_weights_bytes(config, dtype::bf16);
  EXPECT_GT(need.weights, 1e15);  // petabytes: computed in double, not overflowed
  try {
    load_model({dir / "config.json", load_format::dummy, dtype::bf16, 7, false});
    FAIL() << "an absurd dummy model was loaded";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("hidden_size 1048576"), std::string::npos) << what;
    EXPECT_NE(what.find("GiB of memory is available"), std::string::npos) << what;
  }
}

TEST(loader_model_loader, dummy_q8_0_keeps_norms_f32) {
  loaded_model model = load_model({testing::shared_model_dir() / "hf", load_format::dummy, dtype::q8_0, 1, false});
  EXPECT_EQ(model.weights.get("model.layers.0.self_attn.q_proj.weight").type, dtype::q8_0);
  EXPECT_EQ(model.weights.get("model.layers.0.input_layernorm.weight").type, dtype::f32);
  // down_proj rows are 172 values: not whole Q8_0 blocks, so f16.
  EXPECT_EQ(model.weights.get("model.layers.0.mlp.down_proj.weight").type, dtype::f16);
}

TEST(loader_model_loader, format_names_parse) {
  EXPECT_EQ(parse_load_format("dummy"), load_format::dummy);
  EXPECT_EQ(parse_load_format("auto"), load_format::auto_detect);
  expect_error([] { parse_load_format("pickle"); }, {"pickle"});
}

}  // namespace
}  // namespace troupe
