// The model quantizer end to end on small random models: the output keeps the input's
// metadata, every tensor has its planned type and decodes close to the source, an HF directory
// gives the same file as its GGUF twin (names, q/k layout and values), an importance matrix
// lowers the importance-weighted error, threads change nothing, and bad inputs are refused
// naming what is wrong, leaving no output behind.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "model/loader/gguf_file.hpp"
#include "model/loader/model_loader.hpp"
#include "model/model_maker.hpp"
#include "model/model_quantizer.hpp"
#include "model/quant/dequantize.hpp"
#include "tests/model/importance_files.hpp"
#include "tests/model/loader_test_util.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

using testing::expect_error;

made_model make_small_model(const std::filesystem::path& out, bool tied = false) {
  model_maker_options options;
  options.tokenizer = test::stories260k_dir / "hf";
  options.out = out;
  options.hidden_size = 256;
  options.intermediate_size = 512;
  options.num_layers = 2;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  options.tie_word_embeddings = tied;
  options.init_stddev = 0.05f;
  return make_model(options);
}

quantize_options options_for(const std::filesystem::path& in, const std::filesystem::path& out,
                             const std::string& type) {
  quantize_options options;
  options.input = in;
  options.output = out;
  options.type = type;
  options.show_progress = false;
  options.num_threads = 2;
  return options;
}

std::vector<float> decode(const gguf_tensor_info& info) {
  int64_t count = 1;
  for (int64_t d : info.dims) count *= d;
  std::vector<float> values(static_cast<size_t>(count));
  quant::dequantize_row(*info.element_type(), info.data, values.data(), count);
  return values;
}

double relative_error(const std::vector<float>& x, const std::vector<float>& y, const float* importance = nullptr,
                      int64_t columns = 1) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = importance ? importance[i % static_cast<size_t>(columns)] : 1.0;
    error += w * (x[i] - y[i]) * (x[i] - y[i]);
    norm += w * x[i] * x[i];
  }
  return std::sqrt(error / norm);
}

class model_quantizer_test : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto missing = test::missing_shared_model(test::stories260k_dir / "hf"); !missing.empty())
      GTEST_SKIP() << missing;
  }
  testing::scratch_dir dir_;
};

TEST_F(model_quantizer_test, the_output_keeps_the_metadata_and_decodes_close_to_the_source) {
  const made_model made = make_small_model(dir_ / "model");
  model_quantizer quantizer(options_for(made.gguf_path, dir_ / "q4km.gguf", "q4_k_m"));
  const quantize_result result = quantizer.run();
  const gguf_file source = gguf_file::open(made.gguf_path);
  const gguf_file output = gguf_file::open(dir_ / "q4km.gguf");
  for (const std::string& key : source.keys()) {
    if (key == "general.file_type") continue;
    ASSERT_NE(output.find(key), nullptr) << key;
    EXPECT_EQ(output.find(key)->value, source.find(key)->value) << key;
    EXPECT_EQ(output.find(key)->type, source.find(key)->type) << key;
  }
  EXPECT_EQ(output.get_int("general.file_type"), 15);
  EXPECT_EQ(output.get_int("general.quantization_version"), 2);
  EXPECT_EQ(output.find("quantize.imatrix.file"), nullptr);

  ASSERT_EQ(output.tensors().size(), quantizer.plan().size());
  uint64_t bytes = 0;
  for (const planned_tensor& planned : quantizer.plan()) {
    const gguf_tensor_info* in = source.find_tensor(planned.name);
    const gguf_tensor_info* out = output.find_tensor(planned.name);
    ASSERT_TRUE(in && out) << planned.name;
    EXPECT_EQ(out->dims, in->dims) << planned.name;
    EXPECT_EQ(*out->element_type(), planned.to) << planned.name;
    bytes += out->num_bytes;
    const double error = relative_error(decode(*in), decode(*out));
    // 4-bit types keep about 1/10 of a weight's size as error, 5 and 6 bits less; 1-D tensors stay F32.
    const double bound = planned.to == dtype::f32 ? 0.0 : planned.to == dtype::q4_k ? 0.12 : 0.06;
    EXPECT_LE(error, bound) << planned.name << " " << dtype_name(planned.to);
  }
  EXPECT_EQ(result.output_bytes, bytes);
  EXPECT_GT(result.tensors_per_type.at(dtype::q4_k), 0);
  EXPECT_GT(result.tensors_per_type.at(dtype::q6_k), 0);  // output.weight and half the attn_v / ffn_down

  // Troupe loads it as the same model.
  load_options load;
  load.path = dir_ / "q4km.gguf";
  load.show_progress = false;
  const loaded_model loaded = load_model(load);
  EXPECT_EQ(loaded.config.num_layers, made.config.num_layers);
  EXPECT_EQ(loaded.config.vocab_size, made.config.vocab_size);
  EXPECT_EQ(loaded.weights.get("model.layers.1.mlp.down_proj.weight").type, dtype::q6_k);
  EXPECT_EQ(loaded.quantization, "Q4_K_M");  // named by its general.file_type
  load.path = made.hf_dir;
  EXPECT_EQ(load_model(load).quantization, "f32");  // no file type: the type of most weight bytes
  EXPECT_FALSE(std::filesystem::exists(dir_ / "q4km.gguf.part"));
}

TEST_F(model_quantizer_test, an_hf_directory_gives_the_same_tensors_as_its_gguf_twin) {
  const made_model made = make_small_model(dir_ / "model");
  for (const char* type : {"Q4_K_M", "IQ4_XS", "Q8_0"}) {
    model_quantizer(options_for(made.gguf_path, dir_ / "from_gguf.gguf", type)).run();
    model_quantizer(options_for(made.hf_dir, dir_ / "from_hf.gguf", type)).run();
    const gguf_file a = gguf_file::open(dir_ / "from_gguf.gguf");
    const gguf_file b = gguf_file::open(dir_ / "from_hf.gguf");
    ASSERT_EQ(a.tensors().size(), b.tensors().size()) << type;
    for (const gguf_tensor_info& ta : a.tensors()) {
      const gguf_tensor_info* tb = b.find_tensor(ta.name);
      ASSERT_NE(tb, nullptr) << type << " " << ta.name;
      EXPECT_EQ(ta.type, tb->type) << type << " " << ta.name;
      EXPECT_EQ(ta.dims, tb->dims) << type << " " << ta.name;
      ASSERT_EQ(ta.num_bytes, tb->num_bytes) << type << " " << ta.name;
      EXPECT_EQ(std::memcmp(ta.data, tb->data, ta.num_bytes), 0) << type << " " << ta.name << " differs";
    }
    for (const char* key :
         {"general.architecture", "llama.block_count", "llama.embedding_length", "llama.attention.head_count_kv",
          "llama.rope.freq_base", "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id"}) {
      ASSERT_NE(b.find(key), nullptr) << key;
      EXPECT_EQ(a.find(key)->value, b.find(key)->value) << key;
    }
  }
}

TEST_F(model_quantizer_test, an_importance_matrix_lowers_the_weighted_error_and_is_recorded) {
  const made_model made = make_small_model(dir_ / "model");
  const gguf_file source = gguf_file::open(made.gguf_path);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::map<std::string, std::vector<float>> means;
  for (const gguf_tensor_info& info : source.tensors()) {
    if (info.dims.size() < 2) continue;
    for (int64_t c = 0; c < info.dims[0]; ++c) means[info.name].push_back(std::exp(normal(rng)));
  }
  testing::write_legacy_imatrix(dir_ / "imatrix.dat", means);
  quantize_options weighted = options_for(made.gguf_path, dir_ / "weighted.gguf", "Q4_0");
  weighted.importance = dir_ / "imatrix.dat";
  model_quantizer(weighted).run();
  model_quantizer(options_for(made.gguf_path, dir_ / "plain.gguf", "Q4_0")).run();
  const gguf_file with = gguf_file::open(dir_ / "weighted.gguf"), without = gguf_file::open(dir_ / "plain.gguf");
  EXPECT_EQ(with.get_string("quantize.imatrix.file"), (dir_ / "imatrix.dat").string());
  EXPECT_EQ(with.get_int("quantize.imatrix.entries_count"), static_cast<int64_t>(means.size()));
  EXPECT_EQ(with.get_string("quantize.imatrix.dataset"), "calibration.txt");
  int compared = 0;
  for (const auto& [name, importance] : means) {
    const gguf_tensor_info* info = source.find_tensor(name);
    if (*with.find_tensor(name)->element_type() != dtype::q4_0) continue;
    const std::vector<float> x = decode(*info);
    const double weighted_error = relative_error(x, decode(*with.find_tensor(name)), importance.data(), info->dims[0]);
    const double plain_error = relative_error(x, decode(*without.find_tensor(name)), importance.data(), info->dims[0]);
    EXPECT_LT(weighted_error, 0.9 * plain_error) << name;
    ++compared;
  }
  EXPECT_GT(compared, 5);
}

TEST_F(model_quantizer_test, threads_change_no_byte) {
  const made_model made = make_small_model(dir_ / "model");
  quantize_options one = options_for(made.gguf_path, dir_ / "one.gguf", "Q4_K_M");
  one.num_threads = 1;
  quantize_options four = options_for(made.gguf_path, dir_ / "four.gguf", "Q4_K_M");
  four.num_threads = 4;
  model_quantizer(one).run();
  model_quantizer(four).run();
  EXPECT_EQ(testing::read_text(dir_ / "one.gguf"), testing::read_text(dir_ / "four.gguf"));
}

TEST_F(model_quantizer_test, bad_inputs_are_refused_naming_what_is_wrong) {
  const made_model made = make_small_model(dir_ / "model");
  expect_error([&] { model_quantizer(options_for(made.gguf_path, dir_ / "x.gguf", "Q9_K")); },
               {"Q9_K", "Q4_K_M", "IQ4_XS"});
  expect_error([&] { model_quantizer(options_for(dir_ / "nowhere.gguf", dir_ / "x.gguf", "Q8_0")); },
               {"nowhere.gguf", "does not exist"});
  expect_error([&] { model_quantizer(options_for(made.gguf_path, dir_ / "x.gguf", "Q2_K_S")); },
               {"Q2_K_S", "importance matrix"});

  model_quantizer(options_for(made.gguf_path, dir_ / "q4.gguf", "Q4_K_M")).run();
  expect_error([&] { model_quantizer(options_for(dir_ / "q4.gguf", dir_ / "x.gguf", "Q8_0")); },
               {"token_embd.weight", "already q4_K", "F32/F16/BF16"});

  testing::write_gguf_imatrix(dir_ / "short.gguf", {{"blk.1.ffn_up.weight", std::vector<float>(100, 1.0f)}});
  quantize_options wrong_size = options_for(made.gguf_path, dir_ / "x.gguf", "Q4_K_M");
  wrong_size.importance = dir_ / "short.gguf";
  expect_error([&] { model_quantizer refused(wrong_size); },
               {"short.gguf", "blk.1.ffn_up.weight", "100 values", "expected 256"});

  // A NaN weight: refused naming tensor, row and column, and no output is left behind.
  const gguf_file source = gguf_file::open(made.gguf_path);
  gguf_writer poisoned;
  for (const std::string& key : source.keys()) poisoned.set(key, *source.find(key));
  for (const gguf_tensor_info& info : source.tensors()) {
    std::vector<std::byte> bytes(info.data, info.data + info.num_bytes);
    if (info.name == "blk.1.attn_v.weight") {
      const float nan = NAN;
      std::memcpy(bytes.data() + (3 * info.dims[0] + 7) * 4, &nan, 4);
    }
    poisoned.add_tensor(info.name, static_cast<gguf_tensor_type>(info.type), info.dims, std::move(bytes));
  }
  poisoned.write(dir_ / "nan.gguf");
  model_quantizer nan_model(options_for(dir_ / "nan.gguf", dir_ / "out.gguf", "Q4_K_M"));
  expect_error([&] { nan_model.run(); }, {"blk.1.attn_v.weight", "row 3", "column 7", "nan"});
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out.gguf"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out.gguf.part"));

  // A type llama.cpp has and Troupe does not.
  gguf_writer iq2;
  iq2.set("general.architecture", gguf_value::string("llama"));
  iq2.add_tensor("blk.0.attn_q.weight", static_cast<gguf_tensor_type>(16), {256, 1}, std::vector<std::byte>(66));
  iq2.write(dir_ / "iq2.gguf");
  expect_error([&] { model_quantizer(options_for(dir_ / "iq2.gguf", dir_ / "x.gguf", "Q4_K_M")); },
               {"iq2.gguf", "blk.0.attn_q.weight", "IQ2_XXS"});
}

}  // namespace
}  // namespace troupe
