// The per-tensor types of every preset against llama.cpp's own quantizer
// (tests/llama_quantize_oracle.hpp): the same F32 model quantized by llama_model_quantize and
// planned by Troupe's model_quantizer must give every tensor the same type. Three small random
// models cover the rules' branches: eight layers with GQA 4 (which layers' attn_v and ffn_down
// get more bits, and the GQA >= 4 bumps), tied embeddings with GQA 1 (token_embd as the output,
// the GQA < 4 branches), and rows of 96 and 80 values (the fallbacks: 256-block types to 32-block
// ones, and to F16 where no block fits). Where an importance matrix changes the rules (Q4_0 and
// Q5_0's first ffn_downs, the IQ4 mixes, Q2_K_S) both get the same one.

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/loader/gguf_file.hpp"
#include "model/model_maker.hpp"
#include "model/model_quantizer.hpp"
#include "model/quant/quantize_presets.hpp"
#include "model/quantization_label.hpp"
#include "tests/llama_quantize_oracle.hpp"
#include "tests/model/importance_files.hpp"
#include "tests/model/loader_test_util.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

model_maker_options small_model(const std::filesystem::path& out) {
  model_maker_options options;
  options.tokenizer = test::stories260k_dir / "hf";
  options.out = out;
  options.init_stddev = 0.05f;
  return options;
}

// Every 2-D weight's importance: log-normal per column, as real activations are.
std::map<std::string, std::vector<float>> importance_for(const gguf_file& file) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::map<std::string, std::vector<float>> means;
  for (const gguf_tensor_info& info : file.tensors()) {
    if (info.dims.size() < 2) continue;
    std::vector<float>& values = means[info.name];
    for (int64_t c = 0; c < info.dims[0]; ++c) values.push_back(std::exp(normal(rng)));
  }
  return means;
}

struct model_case {
  const char* name;
  model_maker_options options;
  std::vector<std::string> presets;
};

void expect_same_types_as_llama_cpp(const model_case& c, const testing::scratch_dir& dir, bool with_importance) {
  const made_model made = make_model(c.options);
  const std::map<std::string, std::vector<float>> means = importance_for(gguf_file::open(made.gguf_path));
  const std::filesystem::path imatrix = dir / (std::string(c.name) + ".imatrix.gguf");
  testing::write_gguf_imatrix(imatrix, means);
  for (const std::string& preset_name : c.presets) {
    const auto preset = quant::find_preset(preset_name);
    ASSERT_TRUE(preset) << preset_name;
    const std::filesystem::path theirs_path = dir / (std::string(c.name) + "." + preset_name + ".gguf");
    testing::llama_quantize_oracle::instance().quantize(
        made.gguf_path, theirs_path, preset->file_type,
        with_importance ? means : std::map<std::string, std::vector<float>>{});
    const gguf_file theirs = gguf_file::open(theirs_path);

    quantize_options options;
    options.input = made.gguf_path;
    options.output = dir / "unused.gguf";
    options.type = preset_name;
    if (with_importance) options.importance = imatrix;
    options.show_progress = false;
    const model_quantizer ours(options);
    ASSERT_EQ(ours.plan().size(), theirs.tensors().size()) << c.name << " " << preset_name;
    std::map<dtype, int> counts;
    for (const planned_tensor& t : ours.plan()) {
      const gguf_tensor_info* info = theirs.find_tensor(t.name);
      ASSERT_NE(info, nullptr) << t.name;
      EXPECT_EQ(ggml_type_name(static_cast<uint32_t>(gguf_type_of(t.to))), ggml_type_name(info->type))
          << c.name << " " << preset_name << (with_importance ? " with an imatrix" : "") << ": " << t.name;
      ++counts[t.to];
    }
    EXPECT_EQ(theirs.get_int("general.file_type"), preset->file_type);
    std::printf("%-14s %-7s%s %s\n", c.name, preset_name.c_str(), with_importance ? " +imatrix" : "         ",
                describe_type_counts(counts).c_str());
  }
}

TEST(quantize_presets, every_tensor_gets_the_type_llama_cpp_gives_it) {
  if (!testing::llama_quantize_oracle::available()) GTEST_SKIP() << "the npm oracles are not installed";
  if (auto missing = test::missing_shared_model(test::stories260k_dir / "hf"); !missing.empty())
    GTEST_SKIP() << missing;
  testing::scratch_dir dir;

  model_case deep{"8 layers gqa 4", small_model(dir / "deep"), {}};
  deep.options.hidden_size = 256;
  deep.options.intermediate_size = 512;
  deep.options.num_layers = 8;
  deep.options.num_heads = 8;
  deep.options.num_kv_heads = 2;
  deep.presets = {"Q4_0",   "Q4_1",   "Q5_0",   "Q5_1", "Q8_0",   "Q2_K",   "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",
                  "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "F16",    "BF16",   "F32"};

  model_case tied{"tied gqa 1", small_model(dir / "tied"), {"Q2_K", "Q3_K_M", "Q4_K_M", "IQ4_XS", "Q8_0"}};
  tied.options.arch = "qwen2";
  tied.options.hidden_size = 256;
  tied.options.intermediate_size = 512;
  tied.options.num_layers = 4;
  tied.options.num_heads = 4;
  tied.options.num_kv_heads = 4;
  tied.options.tie_word_embeddings = true;

  model_case narrow{
      "rows of 96, 80", small_model(dir / "narrow"), {"Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS", "Q4_0"}};
  narrow.options.hidden_size = 96;
  narrow.options.intermediate_size = 80;
  narrow.options.num_layers = 2;
  narrow.options.num_heads = 4;
  narrow.options.num_kv_heads = 2;

  for (const model_case* c : {&deep, &tied, &narrow}) expect_same_types_as_llama_cpp(*c, dir, false);
  model_case weighted = deep;
  weighted.name = "8 layers +imat";
  weighted.options.out = dir / "weighted";
  weighted.presets = {"Q4_0", "Q5_0", "IQ4_NL", "IQ4_XS", "Q2_K_S", "Q4_K_M"};
  expect_same_types_as_llama_cpp(weighted, dir, true);
}

TEST(quantize_presets, names_aliases_and_file_types) {
  EXPECT_EQ(quant::find_preset("q4_k_m")->name, "Q4_K_M");
  EXPECT_EQ(quant::find_preset("Q4_K")->name, "Q4_K_M");  // llama-quantize's alias
  EXPECT_EQ(quant::find_preset("q5_k")->name, "Q5_K_M");
  EXPECT_EQ(quant::find_preset("iq4_xs")->file_type, 30u);
  EXPECT_EQ(quant::find_preset("Q4_K_M")->file_type, 15u);
  EXPECT_EQ(quant::find_preset("mxfp4")->base, dtype::mxfp4);
  EXPECT_TRUE(quant::find_preset("mxfp4")->pure);
  EXPECT_EQ(quant::find_preset("Q2_K_S")->needs_importance, true);
  EXPECT_EQ(quant::find_preset("IQ2_XXS"), std::nullopt);
  EXPECT_EQ(quant::find_preset("q4_k_x"), std::nullopt);
  EXPECT_EQ(file_type_label(15), "Q4_K_M");
  EXPECT_EQ(file_type_label(1), "F16");
  EXPECT_EQ(file_type_label(999), std::nullopt);
  EXPECT_NE(quant::preset_names().find("IQ4_XS"), std::string::npos);
  // The load log's counts, in llama.cpp's spelling, most first.
  EXPECT_EQ(describe_type_counts({{dtype::q4_k, 97}, {dtype::q6_k, 33}, {dtype::f32, 65}}),
            "q4_K: 97, f32: 65, q6_K: 33");
  EXPECT_EQ(ggml_style_name(dtype::iq4_xs), "iq4_xs");
  EXPECT_EQ(ggml_style_name(dtype::q8_0), "q8_0");
}

}  // namespace
}  // namespace troupe
