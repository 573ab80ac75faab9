// Broken quantized GGUF files are refused with an error naming the tensor, never a crash: a file
// cut inside a quantized tensor, a tensor whose header lies about its type or its size, a NaN
// scale in one block, and a type llama.cpp has and Troupe does not (IQ2_XXS). Each starts from a
// good Q4_K_M file written by the quantizer, so only the one defect differs.

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "model/loader/gguf_file.hpp"
#include "model/loader/gguf_writer.hpp"
#include "model/loader/model_loader.hpp"
#include "model/model_maker.hpp"
#include "model/model_quantizer.hpp"
#include "tests/model/loader_test_util.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

using testing::expect_error;

struct tensor_edit {
  uint32_t type;
  std::vector<int64_t> dims;
  std::vector<std::byte> bytes;
};

// Writes `file` again as `out`, letting `edit` change one tensor's header or bytes.
void rewrite(const gguf_file& file, const std::filesystem::path& out, const std::string& tensor,
             const std::function<void(tensor_edit&)>& edit) {
  gguf_writer writer;
  for (const std::string& key : file.keys()) writer.set(key, *file.find(key));
  for (const gguf_tensor_info& info : file.tensors()) {
    tensor_edit t{info.type, info.dims, std::vector<std::byte>(info.data, info.data + info.num_bytes)};
    if (info.name == tensor) edit(t);
    writer.add_tensor(info.name, static_cast<gguf_tensor_type>(t.type), t.dims, std::move(t.bytes));
  }
  writer.write(out);
}

loaded_model load(const std::filesystem::path& path) {
  load_options options;
  options.path = path;
  options.show_progress = false;
  return load_model(options);
}

TEST(quantized_bad_files, each_defect_is_refused_naming_the_tensor) {
  if (auto missing = test::missing_shared_model(test::stories260k_dir / "hf"); !missing.empty())
    GTEST_SKIP() << missing;
  testing::scratch_dir dir;
  model_maker_options maker;
  maker.tokenizer = test::stories260k_dir / "hf";
  maker.out = dir / "model";
  maker.hidden_size = 256;
  maker.intermediate_size = 512;
  const made_model made = make_model(maker);
  quantize_options options;
  options.input = made.gguf_path;
  options.output = dir / "good.gguf";
  options.type = "Q4_K_M";
  options.show_progress = false;
  model_quantizer(options).run();
  const gguf_file good = gguf_file::open(dir / "good.gguf");
  EXPECT_NO_THROW(load(dir / "good.gguf"));
  const gguf_tensor_info& last = good.tensors().back();

  // Cut inside the last tensor's blocks.
  const std::string whole = testing::read_text(dir / "good.gguf");
  const size_t last_offset = static_cast<size_t>(last.data - good.mapping()->data());
  testing::write_text(dir / "cut.gguf", whole.substr(0, last_offset + last.num_bytes / 2 + 7));
  expect_error([&] { load(dir / "cut.gguf"); }, {"cut.gguf", last.name, "truncated"});

  // The header says Q6_K where Q4_K blocks lie: the tensor runs into the next one.
  rewrite(good, dir / "type.gguf", "blk.0.attn_q.weight", [](tensor_edit& t) { t.type = 14; });
  expect_error([&] { load(dir / "type.gguf"); }, {"type.gguf", "blk.0.attn_q.weight", "overlap"});

  // The header says rows of 200 values: no whole number of 256-blocks.
  rewrite(good, dir / "dims.gguf", "blk.0.ffn_up.weight", [](tensor_edit& t) { t.dims[0] = 200; });
  expect_error([&] { load(dir / "dims.gguf"); }, {"dims.gguf", "blk.0.ffn_up.weight", "200", "block of 256"});

  // A NaN super-block scale in block 3 of a Q4_K tensor.
  rewrite(good, dir / "nan.gguf", "blk.0.attn_q.weight", [](tensor_edit& t) {
    const uint16_t nan = 0x7e00;
    std::memcpy(t.bytes.data() + 3 * 144, &nan, 2);
  });
  expect_error([&] { load(dir / "nan.gguf"); }, {"nan.gguf", "blk.0.attn_q.weight", "NaN", "block 3"});

  // A type llama.cpp has and Troupe does not: refused by its name.
  rewrite(good, dir / "iq2.gguf", "blk.1.ffn_down.weight", [](tensor_edit& t) {
    t.type = 16;  // IQ2_XXS: 66 bytes per 256 values
    t.bytes.resize(static_cast<size_t>(t.dims[0] / 256 * 66 * t.dims[1]));
  });
  expect_error([&] { load(dir / "iq2.gguf"); }, {"iq2.gguf", "blk.1.ffn_down.weight", "IQ2_XXS"});
}

}  // namespace
}  // namespace troupe
