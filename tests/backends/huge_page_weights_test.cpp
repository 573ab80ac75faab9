// Weights copied into huge pages at load (backends/cpu/huge_page_weights.hpp): the views
// move to the copy with every byte unchanged, a tied matrix is copied once, a copy of anonymous
// memory is made only where its owner frees the original (and reported), and a model's logits
// keep their bits.

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "backends/cpu/cpu_model.hpp"
#include "backends/cpu/huge_page_weights.hpp"
#include "backends/cpu/matmul.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "model/loader/mapped_file.hpp"
#include "model/loader/model_loader.hpp"
#include "model/model_maker.hpp"
#include "tests/backends/cpu_greedy_support.hpp"
#include "tests/scratch_dir.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

#define REQUIRE_HUGE_PAGES() \
  if (!cpu::transparent_huge_pages_on_request()) GTEST_SKIP() << "THP is off on this kernel"

TEST(huge_page_weights, float_views_move_to_the_copy_with_their_bytes_and_file_pages_are_dropped) {
  REQUIRE_HUGE_PAGES();
  testing::scratch_dir dir;
  // Two f16 matrices of 3 MiB in one file (so whole pages of each can be dropped), then a view of
  // anonymous memory and a q8_0 one that is not float.
  constexpr int64_t rows = 768, cols = 2048;
  const size_t bytes = static_cast<size_t>(rows * cols) * 2;
  std::vector<std::byte> contents(2 * bytes);
  std::mt19937 rng(3);
  for (auto& b : contents) b = static_cast<std::byte>(rng());
  const auto path = dir.path() / "weights.bin";
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(contents.data()), contents.size());
  const auto file = mapped_file::open(path);

  std::vector<std::byte> anonymous(contents.begin(), contents.begin() + bytes);
  std::vector<std::byte> kept(contents.begin() + bytes, contents.end());
  std::vector<std::byte> q8(34 * 64);
  cpu::weight_view a{dtype::f16, rows, cols, file->data()};
  cpu::weight_view b{dtype::f16, rows, cols, file->data() + bytes};
  cpu::weight_view tied_to_a{dtype::f16, rows, cols, file->data()};
  cpu::weight_view heap{dtype::f16, rows, cols, anonymous.data()};
  cpu::weight_view quantized{dtype::q8_0, 1, 2048, q8.data()};
  cpu::weight_view not_freed{dtype::f16, rows, cols, kept.data()};
  std::vector<cpu::weight_view*> views{&a, &b, &tied_to_a, &heap, &quantized, &not_freed};
  // Only `heap`'s owner frees its original; a copy of `not_freed` would hold it twice.
  const std::vector<bool> owner_frees{false, false, false, true, false, false};

  cpu::thread_pool pool(2);
  const cpu::huge_page_copy copy = cpu::copy_weights_to_huge_pages(pool, views, owner_frees);
  ASSERT_NE(copy.buffer, nullptr);
  EXPECT_NE(a.data, file->data()) << "a float view was not moved";
  EXPECT_EQ(tied_to_a.data, a.data) << "a tied view must share its matrix's copy";
  EXPECT_EQ(quantized.data, q8.data()) << "a type with a repacked layout is not copied";
  EXPECT_EQ(not_freed.data, kept.data()) << "anonymous bytes nobody frees must not be copied";
  EXPECT_EQ(std::memcmp(a.data, contents.data(), bytes), 0);
  EXPECT_EQ(std::memcmp(b.data, contents.data() + bytes, bytes), 0);
  EXPECT_EQ(std::memcmp(heap.data, anonymous.data(), bytes), 0);
  EXPECT_EQ(copy.from_anonymous, std::vector<size_t>{3}) << "only the anonymous source is its owner's to free";
  // The file's pages were dropped, not zeroed: the mapping still reads the file.
  EXPECT_EQ(std::memcmp(file->data(), contents.data(), contents.size()), 0);
}

TEST(huge_page_weights, the_switch_off_leaves_every_view_where_it_was) {
  std::vector<std::byte> weights(64 * 64 * 4);
  cpu::weight_view w{dtype::f32, 64, 64, weights.data()};
  std::vector<cpu::weight_view*> views{&w};
  cpu::thread_pool pool(1);
  cpu::set_weights_in_huge_pages(false);
  const cpu::huge_page_copy copy = cpu::copy_weights_to_huge_pages(pool, views, {});
  cpu::set_weights_in_huge_pages(true);
  EXPECT_EQ(copy.buffer, nullptr);
  EXPECT_EQ(w.data, weights.data());
}

// A model reads the same bits from the copy as from the file, tied embedding included.
TEST(huge_page_weights, a_float_models_logits_keep_their_bits) {
  TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "hf");
  REQUIRE_HUGE_PAGES();
  testing::scratch_dir dir;
  model_maker_options options;
  options.arch = "llama";
  options.hidden_size = 256;
  options.intermediate_size = 512;
  options.num_layers = 2;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  options.seed = 8;
  options.init_stddev = 0.1f;
  options.type = dtype::f16;
  options.tie_word_embeddings = true;
  options.tokenizer = (test::stories260k_dir / "hf").string();
  options.out = dir.path();
  const made_model made = make_model(options);
  std::vector<int32_t> prompt(10), forced(6);
  std::mt19937 rng(2);
  for (auto& t : prompt) t = static_cast<int32_t>(3 + rng() % (made.config.vocab_size - 3));
  for (auto& t : forced) t = static_cast<int32_t>(3 + rng() % (made.config.vocab_size - 3));

  loaded_model loaded = load_model({made.gguf_path});
  cpu::set_weights_in_huge_pages(false);
  auto from_file = make_cpu_model(loaded.config, loaded.weights, {8, 16}, 1);
  cpu::set_weights_in_huge_pages(true);
  auto from_copy = make_cpu_model(loaded.config, loaded.weights, {8, 16}, 1);
  const auto want = test::teacher_forced_logits(*from_file, prompt, forced);
  const auto got = test::teacher_forced_logits(*from_copy, prompt, forced);
  for (size_t step = 0; step < want.size(); ++step) {
    ASSERT_EQ(std::memcmp(got[step].data(), want[step].data(), want[step].size() * sizeof(float)), 0)
        << "step " << step << ": the huge-page copy changed the logits";
  }
}

}  // namespace
}  // namespace troupe
