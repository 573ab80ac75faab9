#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "model/loader/gguf_file.hpp"
#include "model/loader/gguf_model_loader.hpp"
#include "model/loader/gguf_tensor_names.hpp"
#include "model/loader/hf_config.hpp"
#include "model/loader/model_loader.hpp"
#include "model/loader/rope_permutation.hpp"
#include "model/model_maker.hpp"
#include "tests/model/loader_test_util.hpp"

namespace troupe {
namespace {

bool same_bytes(const weight_tensor& a, const weight_tensor& b) {
  return a.num_bytes == b.num_bytes && std::memcmp(a.data, b.data, a.num_bytes) == 0;
}

TEST(gguf_model_loader, stories260k_gguf_equals_hf_after_unpermuting_q_and_k) {
  loaded_model hf = load_model({testing::shared_model_dir() / "hf"});
  loaded_model gguf = load_model({testing::shared_model_dir() / "gguf/stories260K-f32.gguf"});
  EXPECT_EQ(gguf.config.hidden_size, hf.config.hidden_size);
  EXPECT_EQ(gguf.config.num_kv_heads, hf.config.num_kv_heads);
  EXPECT_EQ(gguf.config.head_dim, hf.config.head_dim);
  EXPECT_EQ(gguf.config.vocab_size, hf.config.vocab_size);
  EXPECT_EQ(gguf.config.bos_token_id, 1);
  EXPECT_EQ(gguf.config.eos_token_ids, std::vector<int>{2});
  EXPECT_FALSE(gguf.config.tie_word_embeddings);  // the GGUF carries an explicit output.weight
  int compared = 0;
  for (const auto& [name, tensor] : hf.weights.tensors()) {
    const weight_tensor& other = gguf.weights.get(name);
    EXPECT_EQ(other.shape, tensor.shape) << name;
    EXPECT_TRUE(same_bytes(tensor, other)) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 47);
  EXPECT_TRUE(same_bytes(gguf.weights.get("lm_head.weight"), hf.weights.get("model.embed_tokens.weight")));

  // The GGUF's raw q rows really are in another order: the un-permutation did the work.
  gguf_file raw = gguf_file::open(testing::shared_model_dir() / "gguf/stories260K-f32.gguf");
  const weight_tensor& hf_q = hf.weights.get("model.layers.0.self_attn.q_proj.weight");
  EXPECT_NE(std::memcmp(raw.find_tensor("blk.0.attn_q.weight")->data, hf_q.data, hf_q.num_bytes), 0);
}

TEST(gguf_model_loader, permutation_round_trips_and_matches_the_hf_rule) {
  // 2 heads of head_dim 4, rows tagged by their HF index.
  std::vector<float> hf_rows = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> gguf_rows(8), back(8);
  permute_rows_hf_to_gguf(reinterpret_cast<const std::byte*>(hf_rows.data()),
                          reinterpret_cast<std::byte*>(gguf_rows.data()), 8, 4, 2);
  // Interleaved pairs: per head, HF rows (0,2),(1,3) become adjacent.
  EXPECT_EQ(gguf_rows, (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}));
  permute_rows_gguf_to_hf(reinterpret_cast<const std::byte*>(gguf_rows.data()),
                          reinterpret_cast<std::byte*>(back.data()), 8, 4, 2);
  EXPECT_EQ(back, hf_rows);
}

TEST(gguf_model_loader, tensor_names_map_both_ways) {
  EXPECT_EQ(hf_name_from_gguf("blk.12.attn_q.bias"), "model.layers.12.self_attn.q_proj.bias");
  EXPECT_EQ(hf_name_from_gguf("blk.0.attn_k_norm.weight"), "model.layers.0.self_attn.k_norm.weight");
  EXPECT_EQ(hf_name_from_gguf("output.weight"), "lm_head.weight");
  EXPECT_EQ(hf_name_from_gguf("rope_freqs.weight"), std::nullopt);
  EXPECT_EQ(gguf_name_from_hf("model.layers.3.mlp.down_proj.weight"), "blk.3.ffn_down.weight");
  EXPECT_EQ(gguf_name_from_hf("model.embed_tokens.weight"), "token_embd.weight");
  testing::expect_error([] { gguf_name_from_hf("model.layers.0.mystery.weight"); }, {"model.layers.0.mystery.weight"});
}

TEST(gguf_model_loader, llama3_rope_factors_follow_the_three_bands) {
  model_config config;
  config.head_dim = 128;
  config.rope_theta = 500000.0f;
  config.rope_scaling = llama3_rope_scaling(8.0f, 1.0f, 4.0f, 8192);
  std::vector<float> factors = llama3_rope_factors(config);
  ASSERT_EQ(factors.size(), 64u);
  EXPECT_EQ(factors.front(), 1.0f);  // highest frequency: unscaled
  EXPECT_EQ(factors.back(), 8.0f);   // lowest frequency: scaled by the factor
  for (size_t i = 1; i < factors.size(); ++i) EXPECT_GE(factors[i], factors[i - 1]);
}

TEST(gguf_model_loader, unknown_gguf_architecture_is_named) {
  testing::scratch_dir dir;
  std::string whole = testing::read_text(testing::shared_model_dir() / "gguf/stories260K-f32.gguf");
  // Same length as "llama" so the rest of the file stays valid.
  size_t at = whole.find("llama");
  whole.replace(at, 5, "gpt_x");
  testing::write_text(dir / "arch.gguf", whole);
  testing::expect_error([&] { load_model({dir / "arch.gguf"}); },
                        {"arch.gguf", "unsupported architecture 'gpt_x'", "llama, qwen2, qwen3"});
}

// Whether the page holding p is mapped into this process (bit 63 of its /proc/self/pagemap entry,
// readable without privileges).
bool page_resident(const std::byte* p) {
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const int fd = open("/proc/self/pagemap", O_RDONLY);
  uint64_t entry = 0;
  const bool read = fd >= 0 && pread(fd, &entry, sizeof entry,
                                     static_cast<off_t>(reinterpret_cast<uintptr_t>(p) / page * 8)) == sizeof entry;
  if (fd >= 0) close(fd);
  return read && (entry >> 63) != 0;
}

// The loader copies q and k to undo GGUF's rope permutation; the mapped pages it copied from are
// dropped (mapped_file::release_pages), or they would stay resident beside the copy (and beside a
// repacked copy on the CPU: 60 MB of a 1.1 B Q4_0 model). A tensor used in place (v), once read,
// shows that resident pages are seen.
TEST(gguf_model_loader, unpermuted_q_and_k_leave_no_mapped_pages_resident) {
  // q and k of 1 MiB and 512 KiB: a fault on a neighbouring tensor maps the 64 KiB around it
  // (the kernel's fault-around) back in, so only pages away from the ends are checked.
  testing::scratch_dir dir;
  model_maker_options options;
  options.arch = "llama";
  options.hidden_size = 512;
  options.intermediate_size = 512;
  options.num_layers = 1;
  options.num_heads = 8;
  options.num_kv_heads = 4;
  options.seed = 3;
  options.tokenizer = testing::shared_model_dir() / "hf";
  options.out = dir.path();
  const auto path = make_model(options).gguf_path;
  const loaded_model loaded = load_model({path});
  // The loader's mapping: the one mapping of this file in the process (named by its real path).
  const std::string real = std::filesystem::canonical(path).string();
  const std::byte* base = nullptr;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.size() >= real.size() && line.compare(line.size() - real.size(), std::string::npos, real) == 0) {
      unsigned long begin = 0, offset = 0;
      ASSERT_EQ(std::sscanf(line.c_str(), "%lx-%*x %*s %lx", &begin, &offset), 2);
      if (offset == 0) base = reinterpret_cast<const std::byte*>(begin);
    }
  }
  ASSERT_NE(base, nullptr) << "no mapping of " << path;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto resident_pages = [&](const gguf_tensor_info& info, const gguf_file& file) {
    const std::byte* begin = base + (info.data - file.mapping()->data());
    constexpr size_t fault_around = 64 << 10;
    int whole = 0, resident = 0;
    for (size_t at = fault_around; at + page + fault_around <= info.num_bytes; at += page) {
      ++whole;
      resident += page_resident(begin + at);
    }
    return std::pair{whole, resident};
  };
  const gguf_file file = gguf_file::open(path);
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_k.weight"}) {
    const auto [whole, resident] = resident_pages(*file.find_tensor(name), file);
    ASSERT_GT(whole, 0) << name;
    EXPECT_EQ(resident, 0) << name << ": " << resident << " of its " << whole << " pages are still mapped";
  }
  // The check sees resident pages: v, used in place, once read through the loader's mapping.
  const gguf_tensor_info& v = *file.find_tensor("blk.0.attn_v.weight");
  const std::byte* v_bytes = base + (v.data - file.mapping()->data());
  unsigned sum = 0;
  for (size_t i = 0; i < v.num_bytes; i += 64)
    sum += static_cast<unsigned>(reinterpret_cast<const volatile uint8_t*>(v_bytes)[i]);
  const auto [whole, resident] = resident_pages(v, file);
  ASSERT_GT(whole, 0);
  EXPECT_EQ(resident, whole) << "v's pages, just read, should be resident (sum " << sum << ")";
}

}  // namespace
}  // namespace troupe
