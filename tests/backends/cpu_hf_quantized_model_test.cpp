// Quantized Hugging Face checkpoints end to end on the CPU backend. The model maker writes a
// small random F32 model; the test quantizes its linear layers, packs them in each tool's layout
// (tests/model/hf_quant_writers.hpp) beside a config.json that declares the quantization, and
// writes the same model dequantized to F32 as a plain checkpoint. Both load through load_model,
// as `troupe generate` loads them, and Troupe's logits on the quantized checkpoint must equal
// those on the dequantized one.
//
// Criterion: the weights are the same numbers (scales of 7 significant bits make the repacked
// blocks exact, tests/model/hf_quantized_checkpoint_test.cpp; one case keeps the tools' f16 scales
// to measure q4_1's rounding of its min), so what remains is the kernels' arithmetic. The q4_0 /
// q4_1 integer kernels quantize activations to 8 bits per block of 32 (llama.cpp's scheme), which
// moves these logits (magnitude ~5) by up to 0.19 (measured 0.14-0.19 over the int4 layouts; the
// quantized models against llama.cpp show the same scale); a wrong scale, zero, nibble order or
// column order moves them by O(1) (quantizing itself moves them 2.3-3.2). Tolerance 0.3 on every
// logit of every step, teacher-forced along the dequantized model's greedy tokens; the argmax must agree except
// where the reference's own margin is under twice the tolerance (printed and counted, as in
// cpu_arch_vs_llama_cpp_test.cpp); with no such flip, greedy decoding is the same token for token.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "backends/cpu/cpu_model.hpp"
#include "model/loader/hf_config.hpp"
#include "model/loader/model_loader.hpp"
#include "model/loader/safetensors_writer.hpp"
#include "model/model_maker.hpp"
#include "model/model_tensors.hpp"
#include "tests/backends/cpu_greedy_support.hpp"
#include "tests/model/hf_quant_writers.hpp"

namespace troupe {
namespace {

constexpr double logit_tolerance = 0.3;
constexpr int num_steps = 12;

std::filesystem::path work_dir() {
  return std::filesystem::path(TROUPE_BINARY_DIR) / "cpu_hf_quantized" / std::to_string(getpid());
}

enum class format {
  awq,
  awq_f16_scales,
  gptq_v1,
  gptq_act_order,
  compressed_int4,
  fp8_tensor,
  fp8_channel,
  fp8_blocks
};

struct format_case {
  format kind;
  const char* name;
  const char* arch;
  const char* quantization_config;
};

const format_case cases[] = {
    {format::awq, "awq", "llama",
     R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"})"},
    // Scales as AutoAWQ stores them (any f16): q4_1's min = -zero * scale rounds to f16, the one
    // inexact step of the repacking; its effect on the logits is printed.
    {format::awq_f16_scales, "awq_f16_scales", "mistral",
     R"({"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": true, "version": "gemm"})"},
    {format::gptq_v1, "gptq_v1", "llama",
     R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false, "sym": false, "checkpoint_format": "gptq"})"},
    {format::gptq_act_order, "gptq_act_order", "qwen2",
     R"({"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": true, "sym": true})"},
    {format::compressed_int4, "compressed_int4", "llama",
     R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
         "strategy": "group", "group_size": 128, "symmetric": false, "actorder": "group"}}}, "ignore": ["lm_head"]})"},
    {format::fp8_tensor, "fp8_tensor", "llama", R"({"quant_method": "fp8", "activation_scheme": "static"})"},
    {format::fp8_channel, "fp8_channel", "qwen3",
     R"({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0":
         {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true},
         "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}}}})"},
    {format::fp8_blocks, "fp8_blocks", "llama",
     R"({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})"},
};

// The decoder layers' projections; embeddings, norms and lm_head stay F32 (as the tools leave them).
bool is_linear(const std::string& name) { return name.find("_proj.weight") != std::string::npos; }

// Writes `dir` (quantized, its config declaring it) and `dir`_f32 (the same values dequantized).
void write_pair(const format_case& c, const made_model& made, const std::filesystem::path& dir) {
  const loaded_model source = load_model(load_options{made.hf_dir});
  std::filesystem::create_directories(dir);
  std::filesystem::create_directories(dir.string() + "_f32");
  std::vector<test::owned_tensor> quantized, dequantized;
  uint32_t seed = 1;
  for (const tensor_spec& spec : expected_tensors(source.config)) {
    const weight_tensor& t = source.weights.get(spec.name);
    std::vector<float> w(static_cast<size_t>(t.num_elements()));
    std::memcpy(w.data(), t.data, w.size() * 4);
    if (!is_linear(spec.name)) {
      quantized.push_back(test::float_tensor(spec.name, "F32", spec.shape, w));
      dequantized.push_back(test::float_tensor(spec.name, "F32", spec.shape, w));
      continue;
    }
    const int64_t out = spec.shape[0], in = spec.shape[1];
    const std::string prefix = spec.name.substr(0, spec.name.size() - std::string(".weight").size());
    std::vector<float> values(w.size());
    std::vector<test::owned_tensor> packed;
    auto fill = [&](const auto& codes) {
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) values[o * in + i] = static_cast<float>(codes.value(o, i));
    };
    switch (c.kind) {
      case format::awq: {
        const auto codes = test::quantize_int4(w, out, in, 128, false, false, seed++);
        packed = test::pack_awq(prefix, codes);
        fill(codes);
        break;
      }
      case format::awq_f16_scales: {
        const auto codes = test::quantize_int4(w, out, in, 64, false, false, seed++, false);
        packed = test::pack_awq(prefix, codes);
        fill(codes);
        break;
      }
      case format::gptq_v1: {
        const auto codes = test::quantize_int4(w, out, in, 128, false, false, seed++);
        packed = test::pack_gptq(prefix, codes, true, true);
        fill(codes);
        break;
      }
      case format::gptq_act_order: {
        const auto codes = test::quantize_int4(w, out, in, 64, true, true, seed++);
        packed = test::pack_gptq(prefix, codes, true, true);
        fill(codes);
        break;
      }
      case format::compressed_int4: {
        const auto codes = test::quantize_int4(w, out, in, 128, true, false, seed++);
        packed = test::pack_compressed_int4(prefix, codes, false, true);
        fill(codes);
        break;
      }
      case format::fp8_tensor: {
        const auto codes = test::quantize_fp8(w, out, in, out, in);
        packed = test::pack_fp8(prefix, codes, "weight_scale", "F32", {});
        packed.push_back(test::float_tensor(prefix + ".input_scale", "F32", {}, {0.02f}));
        fill(codes);
        break;
      }
      case format::fp8_channel: {
        const auto codes = test::quantize_fp8(w, out, in, 1, in);
        packed = test::pack_fp8(prefix, codes, "weight_scale", "BF16", {out, 1});
        fill(codes);
        break;
      }
      case format::fp8_blocks: {
        const auto codes = test::quantize_fp8(w, out, in, 128, 128);
        packed = test::pack_fp8(prefix, codes, "weight_scale_inv", "F32", {(out + 127) / 128, (in + 127) / 128});
        fill(codes);
        break;
      }
    }
    for (auto& p : packed) quantized.push_back(std::move(p));
    dequantized.push_back(test::float_tensor(spec.name, "F32", spec.shape, values));
  }
  write_safetensors(dir / "model.safetensors", test::views_of(quantized));
  write_safetensors(dir.string() + "_f32/model.safetensors", test::views_of(dequantized));
  nlohmann::json config = read_json_file(made.hf_dir / "config.json");
  std::ofstream(dir.string() + "_f32/config.json") << config.dump(2);
  config["quantization_config"] = nlohmann::json::parse(c.quantization_config);
  std::ofstream(dir / "config.json") << config.dump(2);
}

class cpu_hf_quantized_model : public ::testing::TestWithParam<format_case> {
 protected:
  static void TearDownTestSuite() {
    std::error_code ignored;
    std::filesystem::remove_all(work_dir(), ignored);
  }
};

TEST_P(cpu_hf_quantized_model, logits_equal_the_dequantized_f32_checkpoints) {
  const format_case& c = GetParam();
  model_maker_options options;
  options.arch = c.arch;
  options.hidden_size = 256;
  options.intermediate_size = 512;
  options.num_layers = 2;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  options.init_stddev = 0.08f;  // peaked logits: few near-ties between random tokens
  options.seed = 17;
  if (std::string(c.arch) == "qwen2") options.tie_word_embeddings = true;
  options.tokenizer = std::string(TROUPE_SHARED_DIR) + "/models/stories260K/hf";
  options.out = work_dir() / (std::string(c.name) + "_source");
  std::filesystem::remove_all(options.out);
  const made_model made = make_model(options);
  const std::filesystem::path dir = work_dir() / c.name;
  write_pair(c, made, dir);

  const loaded_model quantized = load_model(load_options{dir});
  const loaded_model reference = load_model(load_options{dir.string() + "_f32"});
  const dtype expected_type = c.kind == format::fp8_tensor || c.kind == format::fp8_channel ? dtype::fp8_e4m3
                              : c.kind == format::fp8_blocks                                ? dtype::fp8_e4m3_b128
                              : c.kind == format::gptq_act_order                            ? dtype::q4_0
                                                                                            : dtype::q4_1;
  const weight_tensor& down = quantized.weights.get("model.layers.1.mlp.down_proj.weight");
  EXPECT_EQ(down.type, expected_type);
  EXPECT_EQ(!down.input_order.empty(), c.kind == format::gptq_act_order || c.kind == format::compressed_int4);

  const loaded_model original = load_model(load_options{made.hf_dir});  // before quantization, for scale
  auto quantized_model = make_cpu_model(quantized.config, quantized.weights, {64, 16}, 2);
  auto reference_model = make_cpu_model(reference.config, reference.weights, {64, 16}, 2);
  auto original_model = make_cpu_model(original.config, original.weights, {64, 16}, 2);
  const int vocab = reference.config.vocab_size;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> token(3, vocab - 1);
  int compared = 0, flips = 0;
  double worst = 0, largest_logit = 0, quantization_effect = 0;
  for (int p = 0; p < 3; ++p) {
    std::vector<int32_t> prompt = {1};
    for (int i = 0; i < 3 + 7 * p; ++i) prompt.push_back(token(rng));  // the longest prompt is a prefill of 17
    const test::greedy_result greedy = test::greedy_generate(*reference_model, prompt, num_steps);
    const auto ours = test::teacher_forced_logits(*quantized_model, prompt, greedy.generated);
    const auto theirs = test::teacher_forced_logits(*reference_model, prompt, greedy.generated);
    const auto unquantized = test::teacher_forced_logits(*original_model, prompt, greedy.generated);
    for (int step = 0; step < num_steps; ++step) {
      ++compared;
      for (int v = 0; v < vocab; ++v) {
        worst = std::max(worst, std::fabs(double(ours[step][v]) - theirs[step][v]));
        largest_logit = std::max(largest_logit, std::fabs(double(theirs[step][v])));
        quantization_effect = std::max(quantization_effect, std::fabs(double(unquantized[step][v]) - theirs[step][v]));
      }
      const int our_token = test::argmax(ours[step].data(), vocab);
      if (our_token != greedy.generated[step]) {
        ++flips;
        std::printf("%s prompt %d step %d: token %d instead of %d at a margin of %.3g\n", c.name, p, step, our_token,
                    greedy.generated[step], greedy.margins[step]);
        EXPECT_LE(greedy.margins[step], 2 * logit_tolerance) << "a flip away from a near-tie";
      }
    }
    if (flips == 0) {
      EXPECT_EQ(test::greedy_generate(*quantized_model, prompt, num_steps).generated, greedy.generated)
          << "prompt " << p;
    }
  }
  std::printf(
      "%s: %d steps, largest logit difference %.3g, %d flips (logits up to %.3g; quantizing moved them by "
      "up to %.3g)\n",
      c.name, compared, worst, flips, largest_logit, quantization_effect);
  EXPECT_LE(worst, logit_tolerance);
}

INSTANTIATE_TEST_SUITE_P(formats, cpu_hf_quantized_model, ::testing::ValuesIn(cases),
                         [](const ::testing::TestParamInfo<format_case>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace troupe
