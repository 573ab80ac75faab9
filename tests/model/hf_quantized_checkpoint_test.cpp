// Quantized Hugging Face checkpoints: each tool's layout (tests/model/hf_quant_writers.hpp packs
// known codes, zeros and scales in the tool's own order) must load into weights whose values are
// exactly the known ones (scales of 7 significant bits make every product exact), and bad
// configs or tensors must be refused naming the field or tensor.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "model/loader/hf_quantization.hpp"
#include "model/loader/dummy_weights.hpp"
#include "model/loader/hf_weights.hpp"
#include "model/weight_values.hpp"
#include "tests/model/hf_quant_writers.hpp"
#include "tests/model/loader_test_util.hpp"

namespace troupe {
namespace {

using testing::expect_error;

const std::string layer = "model.layers.0.mlp.up_proj";

hf_quantization config(const std::string& json) {
  return parse_hf_quantization(nlohmann::json::parse(json), "test config");
}

const hf_quantization awq =
    config(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"})");
const hf_quantization gptq_v1 =
    config(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false, "sym": false})");
const hf_quantization gptq_act_order =
    config(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": true, "sym": true})");

// The weights `tensors` load into (an FP8 weight with row scales views the tensors' bytes, which
// must then outlive the store).
weight_store load(const std::vector<test::owned_tensor>& tensors, const hf_quantization& q) {
  safetensors_checkpoint checkpoint;
  checkpoint.tensors = test::views_of(tensors);
  weight_store store;
  add_hf_weights(checkpoint, q, store);
  return store;
}

std::vector<float> values_of(const weight_tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.num_elements()));
  weight_rows_f32(tensor, 0, tensor.rows(), values.data());
  return values;
}

// Every loaded value equals the known one exactly.
template <typename Codes>
void expect_exact(const weight_tensor& tensor, const Codes& codes) {
  ASSERT_EQ(tensor.shape, (std::vector<int64_t>{codes.out, codes.in}));
  const std::vector<float> values = values_of(tensor);
  int64_t mismatches = 0;
  for (int64_t o = 0; o < codes.out; ++o) {
    for (int64_t i = 0; i < codes.in; ++i) {
      if (values[o * codes.in + i] != codes.value(o, i) && mismatches++ < 5) {
        ADD_FAILURE() << tensor.name << " (" << o << ", " << i << "): loaded " << values[o * codes.in + i]
                      << ", expected " << codes.value(o, i);
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(hf_quantized_checkpoint, awq_gemm_unpacks_to_the_known_values_as_q4_1) {
  const test::int4_codes codes = test::random_int4(64, 256, 128, false, false, 1);
  const weight_store store = load(test::pack_awq(layer, codes), awq);
  const weight_tensor& weight = store.get(layer + ".weight");
  EXPECT_EQ(weight.type, dtype::q4_1);
  EXPECT_TRUE(weight.input_order.empty());
  expect_exact(weight, codes);
  EXPECT_FALSE(store.contains(layer + ".qweight"));
  EXPECT_FALSE(store.contains(layer + ".scales"));
}

TEST(hf_quantized_checkpoint, gptq_v1_asymmetric_zeros_survive_the_borrow_of_a_zero_of_0) {
  const test::int4_codes codes = test::random_int4(48, 256, 128, false, false, 2);
  ASSERT_EQ(codes.zero[0], 0);  // stored as zero - 1 = -1: the word's subtraction borrows from zero[1]
  const weight_store store = load(test::pack_gptq(layer, codes, true, true), gptq_v1);
  EXPECT_EQ(store.get(layer + ".weight").type, dtype::q4_1);
  expect_exact(store.get(layer + ".weight"), codes);
}

TEST(hf_quantized_checkpoint, gptq_v2_and_symmetric_gptq_load_exactly_the_latter_as_q4_0) {
  const test::int4_codes asymmetric = test::random_int4(32, 128, 32, false, false, 3);
  const hf_quantization v2 = config(R"({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": false,
                                        "checkpoint_format": "gptq_v2"})");
  expect_exact(load(test::pack_gptq(layer, asymmetric, false, true), v2).get(layer + ".weight"), asymmetric);

  const test::int4_codes symmetric = test::random_int4(32, 256, 0, false, true, 4);  // group_size -1
  const hf_quantization per_row = config(R"({"quant_method": "gptq", "bits": 4, "group_size": -1, "sym": true})");
  const weight_store store =
      load(test::pack_gptq(layer, symmetric, true, false), per_row);  // no g_idx: groups in order
  EXPECT_EQ(store.get(layer + ".weight").type, dtype::q4_0);
  expect_exact(store.get(layer + ".weight"), symmetric);
}

TEST(hf_quantized_checkpoint, gptq_act_order_sorts_columns_by_group_and_keeps_the_values) {
  const test::int4_codes codes = test::random_int4(32, 512, 128, true, true, 5);
  const weight_store store = load(test::pack_gptq(layer, codes, true, true), gptq_act_order);
  const weight_tensor& weight = store.get(layer + ".weight");
  ASSERT_EQ(weight.input_order.size(), 512u);
  // Stored column j is input column input_order[j]; every block of 32 stored columns is one group.
  for (int64_t j = 0; j < 512; ++j) {
    EXPECT_EQ(codes.group[weight.input_order[j]], codes.group[weight.input_order[j / 32 * 32]]) << j;
  }
  expect_exact(weight, codes);
}

TEST(hf_quantized_checkpoint, compressed_tensors_pack_quantized_symmetric_asymmetric_and_act_order) {
  const hf_quantization symmetric = config(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "quantization_status": "compressed", "config_groups": {"group_0": {"targets": ["Linear"],
      "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": true}}}})");
  const test::int4_codes sym_codes = test::random_int4(40, 256, 128, false, true, 6);
  const weight_store sym_store = load(test::pack_compressed_int4(layer, sym_codes, true, false), symmetric);
  EXPECT_EQ(sym_store.get(layer + ".weight").type, dtype::q4_0);
  expect_exact(sym_store.get(layer + ".weight"), sym_codes);
  EXPECT_FALSE(sym_store.contains(layer + ".weight_shape"));

  const hf_quantization asymmetric = config(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
      "strategy": "group", "group_size": 64, "symmetric": false, "actorder": "group"}}}})");
  const test::int4_codes asym_codes = test::random_int4(36, 256, 64, true, false, 7);  // 36 rows: a partial zero word
  const weight_store asym_store = load(test::pack_compressed_int4(layer, asym_codes, false, true), asymmetric);
  EXPECT_EQ(asym_store.get(layer + ".weight").type, dtype::q4_1);
  EXPECT_FALSE(asym_store.get(layer + ".weight").input_order.empty());
  expect_exact(asym_store.get(layer + ".weight"), asym_codes);
}

TEST(hf_quantized_checkpoint, fp8_per_tensor_and_per_channel_scales_ride_beside_the_mapped_weight) {
  const hf_quantization fp8 = config(R"({"quant_method": "fp8", "activation_scheme": "static"})");
  EXPECT_TRUE(fp8.static_input_scales);
  const test::fp8_codes per_tensor = test::random_fp8(24, 96, 24, 96, 8);
  std::vector<test::owned_tensor> tensors = test::pack_fp8(layer, per_tensor, "weight_scale", "F32", {});
  tensors.push_back(test::float_tensor(layer + ".input_scale", "F32", {}, {0.5f}));  // static activations: dropped
  const weight_store store = load(tensors, fp8);
  const weight_tensor& weight = store.get(layer + ".weight");
  EXPECT_EQ(weight.type, dtype::fp8_e4m3);
  EXPECT_EQ(weight.data, tensors[0].bytes.data());  // in place: the file's bytes, not a copy
  EXPECT_EQ(weight.row_scales.size(), 24u);
  expect_exact(weight, per_tensor);
  EXPECT_FALSE(store.contains(layer + ".input_scale"));

  const hf_quantization channel = config(R"({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
      "strategy": "channel", "symmetric": true, "dynamic": false}, "input_activations": {"num_bits": 8,
      "type": "float", "strategy": "token", "dynamic": true}}}, "ignore": ["lm_head"]})");
  const test::fp8_codes per_channel = test::random_fp8(24, 96, 1, 96, 9);
  const std::vector<test::owned_tensor> channel_tensors =
      test::pack_fp8(layer, per_channel, "weight_scale", "BF16", {24, 1});
  const weight_store channel_store = load(channel_tensors, channel);  // views channel_tensors' bytes
  EXPECT_EQ(channel_store.get(layer + ".weight").type, dtype::fp8_e4m3);
  expect_exact(channel_store.get(layer + ".weight"), per_channel);
}

TEST(hf_quantized_checkpoint, fp8_block_scales_become_b128_blocks) {
  const hf_quantization blocks = config(R"({"quant_method": "fp8", "activation_scheme": "dynamic",
                                            "weight_block_size": [128, 128]})");
  const test::fp8_codes codes = test::random_fp8(200, 384, 128, 128, 10);  // a partial block of rows
  const weight_store store = load(test::pack_fp8(layer, codes, "weight_scale_inv", "F32", {2, 3}), blocks);
  const weight_tensor& weight = store.get(layer + ".weight");
  EXPECT_EQ(weight.type, dtype::fp8_e4m3_b128);
  EXPECT_EQ(weight.num_bytes, 200u * 3 * 132);
  expect_exact(weight, codes);

  // compressed-tensors strategy group (group 256 along the columns): blocks of [1, 256].
  const hf_quantization group = config(R"({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "group",
      "group_size": 256}}}})");
  const test::fp8_codes grouped = test::random_fp8(8, 512, 1, 256, 11);
  expect_exact(load(test::pack_fp8(layer, grouped, "weight_scale", "BF16", {8, 2}), group).get(layer + ".weight"),
               grouped);
}

// AWQ's scales are arbitrary f16: q4_1 keeps d exactly, and m = -zero * scale loses at most half
// an f16 step, 2^-11 of |zero * scale|.
TEST(hf_quantized_checkpoint, q4_1_error_from_arbitrary_scales_stays_within_the_f16_rounding_of_the_min) {
  test::int4_codes codes = test::random_int4(64, 256, 128, false, false, 12);
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> uniform(1e-3f, 2e-2f);
  for (float& s : codes.scale) s = f16_to_f32(f32_to_f16(uniform(rng)));
  const std::vector<float> values = values_of(load(test::pack_awq(layer, codes), awq).get(layer + ".weight"));
  double worst_ratio = 0, worst_error = 0;
  for (int64_t o = 0; o < codes.out; ++o) {
    for (int64_t i = 0; i < codes.in; ++i) {
      const int64_t g = codes.group[i];
      const double bound = std::ldexp(std::fabs(codes.zero[g * codes.out + o] * codes.scale[g * codes.out + o]), -11);
      const double error = std::fabs(values[o * codes.in + i] - codes.value(o, i));
      worst_error = std::max(worst_error, error);
      if (bound > 0) worst_ratio = std::max(worst_ratio, error / bound);
      ASSERT_LE(error, bound * 1.001 + 1e-12) << o << ", " << i;
    }
  }
  std::printf("q4_1 from arbitrary f16 scales: worst error %.3g, %.3f of the 2^-11 |zero*scale| bound\n", worst_error,
              worst_ratio);
}

// Dummy FP8 weights (benchmarks: troupe_bench_cpu --dtype fp8_e4m3) are laid out as per-channel
// FP8 checkpoints load: E4M3 rows with a scale each, max |row| / 448.
TEST(hf_quantized_checkpoint, dummy_fp8_weights_carry_a_scale_per_row) {
  model_config c;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 1;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 50;
  const weight_store f32 = make_dummy_weights(c, dtype::f32, 3);
  const weight_store fp8 = make_dummy_weights(c, dtype::fp8_e4m3, 3);
  const weight_tensor& up = fp8.get("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(up.type, dtype::fp8_e4m3);
  ASSERT_EQ(up.row_scales.size(), 128u);
  EXPECT_EQ(fp8.get("model.layers.0.input_layernorm.weight").type, dtype::f32);
  const std::vector<float> values = values_of(up);
  const auto* exact = reinterpret_cast<const float*>(f32.get(up.name).data);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_NEAR(values[i], exact[i], std::fabs(exact[i]) / 16 + up.row_scales[i / 64] / 512) << i;  // E4M3: 3 bits
  }
}

TEST(hf_quantized_checkpoint, configs_of_every_tool_parse_and_other_methods_are_refused_by_name) {
  EXPECT_EQ(awq.layout, hf_quant_layout::awq);
  EXPECT_EQ(awq.group_size, 128);
  EXPECT_TRUE(gptq_v1.zeros_minus_one);
  EXPECT_TRUE(gptq_act_order.act_order);
  // AutoAWQ's own quant_config.json names its fields w_bit / q_group_size.
  EXPECT_EQ(config(R"({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "version": "GEMM"})").group_size, 64);
  EXPECT_EQ(config(R"({"quant_method": "gptq", "bits": 4, "group_size": -1})").group_size, 0);

  auto refused = [](const std::string& json, std::initializer_list<std::string> parts) {
    expect_error([&] { config(json); }, parts);
  };
  refused(R"({"quant_method": "bitsandbytes", "load_in_4bit": true})",
          {"test config", "'quant_method'", "'bitsandbytes'"});
  refused(R"({"quant_method": "hqq"})", {"'hqq'", "not load"});
  refused(R"({"quant_method": "exl2"})", {"'exl2'"});
  refused(R"({"bits": 4})", {"'quant_method' is missing"});
  refused(R"({"quant_method": "gptq", "bits": 3, "group_size": 128})", {"'bits' is 3", "4 bits"});
  refused(R"({"quant_method": "gptq", "bits": 8, "group_size": 128})", {"'bits' is 8"});
  refused(R"({"quant_method": "awq", "bits": 4, "group_size": 48})", {"'group_size' is 48", "multiple of 32"});
  refused(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"})", {"'version'", "gemv"});
  refused(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": false})", {"'zero_point'"});
  refused(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"})",
          {"'checkpoint_format'", "marlin"});
  refused(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "dynamic": {"-:.*down": {}}})", {"'dynamic'"});
  refused(R"({"quant_method": "fp8", "activation_scheme": "per-token"})", {"'activation_scheme'", "per-token"});
  refused(R"({"quant_method": "fp8", "weight_block_size": [128]})", {"'weight_block_size'"});
  refused(R"({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"group_0":
             {"weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}})",
          {"config_groups.group_0.weights", "int with num_bits 8"});
  refused(R"({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {"group_0":
             {"weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}})",
          {"float with num_bits 4"});
  refused(R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0":
             {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 16}}}})",
          {"group_size is 16"});
  refused(R"({"quant_method": "compressed-tensors", "format": "float-quantized", "sparsity_config":
             {"format": "sparse-24-bitmask"}, "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}})",
          {"'sparsity_config'", "sparse-24-bitmask"});
}

TEST(hf_quantized_checkpoint, config_is_read_from_config_json_or_the_older_tools_own_files) {
  testing::scratch_dir dir;
  EXPECT_FALSE(read_hf_quantization(dir.path()));  // no config at all: not quantized
  testing::write_text(dir / "config.json", R"({"architectures": ["LlamaForCausalLM"]})");
  EXPECT_FALSE(read_hf_quantization(dir.path()));
  testing::write_text(dir / "quantize_config.json", R"({"bits": 4, "group_size": 128, "desc_act": true, "sym": true})");
  const auto legacy_gptq = read_hf_quantization(dir.path());
  ASSERT_TRUE(legacy_gptq);
  EXPECT_EQ(legacy_gptq->layout, hf_quant_layout::gptq);
  EXPECT_TRUE(legacy_gptq->act_order);
  testing::write_text(dir / "config.json", R"({"compression_config": {"quant_method": "compressed-tensors", "format":
      "float-quantized", "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}}})");
  const auto old_llm_compressor = read_hf_quantization(dir.path());
  ASSERT_TRUE(old_llm_compressor);
  EXPECT_EQ(old_llm_compressor->layout, hf_quant_layout::fp8);
  testing::write_text(dir / "config.json",
                      R"({"quantization_config": {"quant_method": "awq", "bits": 3, "group_size": 128}})");
  expect_error([&] { read_hf_quantization(dir.path()); }, {"config.json quantization_config", "'bits' is 3"});
}

TEST(hf_quantized_checkpoint, bad_tensors_are_refused_naming_the_tensor) {
  const test::int4_codes codes = test::random_int4(32, 256, 128, false, false, 14);

  // A qweight of the wrong shape.
  std::vector<test::owned_tensor> wrong_shape = test::pack_gptq(layer, codes, true, true);
  wrong_shape[0].shape = {16, 64};  // the same bytes as [in/8 = 32, out = 32]
  expect_error([&] { load(wrong_shape, gptq_v1); }, {layer + ".qweight", "shape [16,64]", "32 output columns"});
  wrong_shape = test::pack_awq(layer, codes);
  wrong_shape[0].shape = {128, 8};
  expect_error([&] { load(wrong_shape, awq); }, {layer + ".qweight", "shape [128,8]", "expected [in_features, 4]"});
  wrong_shape[0].shape = {128, 4};
  wrong_shape[0].bytes.resize(128 * 4 * 4);
  expect_error([&] { load(wrong_shape, awq); }, {layer + ".qweight", "128 input rows", "2 groups of 128"});

  // A NaN scale.
  test::int4_codes nan_scale = codes;
  nan_scale.scale[5] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { load(test::pack_gptq(layer, nan_scale, true, true), gptq_v1); },
               {layer + ".weight", "group 0, row 5", "NaN"});
  test::fp8_codes fp8 = test::random_fp8(16, 128, 1, 128, 15);
  fp8.scale[3] = std::numeric_limits<float>::infinity();
  const hf_quantization fp8_config = config(R"({"quant_method": "fp8"})");
  expect_error(
      [&] {
        load(test::pack_fp8(layer, fp8, "weight_scale", "F32", {16, 1}), fp8_config);
      },
      {layer + ".weight_scale", "element 3", "NaN or infinite"});

  // desc_act without g_idx.
  const test::int4_codes act_order = test::random_int4(32, 256, 128, true, true, 16);
  expect_error([&] { load(test::pack_gptq(layer, act_order, true, false), gptq_act_order); },
               {layer + ".g_idx", "missing", "desc_act"});

  // A g_idx naming a group the scales do not have.
  std::vector<test::owned_tensor> bad_g_idx = test::pack_gptq(layer, codes, true, true);
  reinterpret_cast<int32_t*>(bad_g_idx[3].bytes.data())[7] = 9;
  expect_error([&] { load(bad_g_idx, gptq_v1); }, {layer + ".g_idx", "entry 7 is 9", "2 groups"});

  // Groups whose columns cannot be cut into blocks of 32 (a group of 16 scattered columns).
  test::int4_codes odd_groups = test::random_int4(32, 256, 128, false, true, 17);
  for (int64_t i = 0; i < 16; ++i) odd_groups.group[i] = 1;
  for (int64_t i = 128; i < 144; ++i) odd_groups.group[i] = 0;
  odd_groups.group[200] = 0;  // group 0 now has 113 columns
  expect_error([&] { load(test::pack_gptq(layer, odd_groups, true, true), gptq_act_order); },
               {layer + ".weight", "g_idx", "multiple of 32"});

  // An FP8 NaN weight, and an FP8 weight without its scale.
  test::fp8_codes nan_weight = test::random_fp8(4, 128, 4, 128, 18);
  nan_weight.code[130] = 0xff;
  expect_error([&] { load(test::pack_fp8(layer, nan_weight, "weight_scale", "F32", {}), fp8_config); },
               {layer + ".weight", "NaN", "row 1, column 2"});
  std::vector<test::owned_tensor> no_scale = test::pack_fp8(layer, nan_weight, "weight_scale", "F32", {});
  no_scale.pop_back();
  expect_error([&] { load(no_scale, fp8_config); }, {layer + ".weight_scale", "missing"});

  // The parts of a layer without its qweight; a qweight that is not int32.
  std::vector<test::owned_tensor> orphan = test::pack_awq(layer, codes);
  orphan.erase(orphan.begin());
  expect_error([&] { load(orphan, awq); }, {layer + ".qzeros", "no quantized " + layer + ".qweight"});
  std::vector<test::owned_tensor> wrong_type = test::pack_awq(layer, codes);
  wrong_type[0].type = "F32";
  expect_error([&] { load(wrong_type, awq); }, {layer + ".qweight", "is F32, expected I32"});

  // Packed weights in a checkpoint that declares no quantization.
  safetensors_checkpoint plain;
  const std::vector<test::owned_tensor> packed = test::pack_gptq(layer, codes, true, true);
  plain.tensors = test::views_of(packed);
  weight_store store;
  expect_error([&] { add_hf_weights(plain, std::nullopt, store); }, {layer + ".qweight", "no quantization_config"});
}

}  // namespace
}  // namespace troupe
