// CPU attention and its KV pool against independent references:
// - the pool's SIMD encodings of every KV dtype give the bytes of the portable reference
//   (model/kv_transfer.hpp's kv_encode_f32), and decode to what it decodes;
// - attention of mixed batches (decodes, chunked prefills, fresh prompts, a few speculative
//   tokens) over scattered blocks equals a double-precision softmax(q·kᵀ·scale)·v computed from
//   the values the pool holds, for head sizes 64/80/96/128/256, GQA ratios 1 to 8, blocks of 1,
//   7, 16 and 32 tokens, contexts up to 32k (split across threads), every KV dtype and every
//   SIMD level this machine has; and with a sliding window, Gemma 2's soft-capping and gpt-oss's
//   sinks, each alone and together;
// - a query's output has the same bits however its step was cut (whole prompt, decode steps,
//   chunks; any thread count; beside other sequences).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/cpu_model.hpp"
#include "backends/cpu/kv_pool.hpp"
#include "backends/cpu/paged_attention.hpp"
#include "backends/cpu/paged_attention_kernels.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "model/half_float.hpp"
#include "model/kv_transfer.hpp"
#include "tests/backends/cpu_test_support.hpp"

namespace troupe {
namespace {

using test::scoped_simd_level;
using test::supported_simd_levels;

constexpr dtype all_kv_types[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::fp8_e4m3};

std::string level_name(cpu::simd_level level) { return std::string(cpu::simd_level_name(level)); }

// Values that exercise rounding: ties of f16/bf16/fp8, fp8 subnormals and saturation, zeros.
std::vector<float> awkward_floats(size_t count, uint32_t seed) {
  std::vector<float> values = test::random_floats(count, seed, 2.0f);
  const float special[] = {0.0f,        -0.0f,   1.0f,          -1.0f,         448.0f,         -448.0f,
                           464.0f,      500.0f,  -1e6f,         0.0009765625f, 0.00146484375f, 0.0048828125f,
                           1.0625f,     1.1875f, 3.0e-5f,       -6.1e-5f,      65504.0f,       1.00048828125f,
                           1.00390625f, 2.0e-3f, -0.013671875f, 0.015625f,     0.0146484375f,  7.0e-8f};
  for (size_t i = 0; i < count; i += 3) values[i] = special[(i / 3) % std::size(special)];
  return values;
}

TEST(cpu_kv_pool, simd_encodings_give_the_reference_bytes_and_values) {
  const size_t count = 32 * 40;  // whole q8_0 blocks
  const std::vector<float> values = awkward_floats(count, 7);
  for (cpu::simd_level level : supported_simd_levels()) {
    const cpu::attention_kernels& kernels = cpu::attention_kernels_for(level);
    for (dtype type : all_kv_types) {
      std::vector<std::byte> want(kv_bytes(type, count)), got(want.size());
      kv_encode_f32(type, values.data(), want.data(), count);
      kernels.encode[static_cast<int>(type)](values.data(), count, got.data());
      for (size_t b = 0; b < want.size(); ++b) {
        ASSERT_EQ(got[b], want[b]) << level_name(level) << " " << dtype_name(type) << " byte " << b;
      }
      std::vector<float> decoded_want(count), decoded_got(count);
      kv_decode_f32(type, want.data(), decoded_want.data(), count);
      kernels.decode_rows[static_cast<int>(type)](want.data(), count, decoded_got.data());
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(decoded_got[i], decoded_want[i]) << level_name(level) << " " << dtype_name(type) << " element " << i;
      }
    }
    // Every finite fp8 code decodes exactly (subnormals included).
    std::vector<std::byte> codes;
    for (int c = 0; c < 256; ++c)
      if ((c & 0x7f) != 0x7f) codes.push_back(static_cast<std::byte>(c));
    codes.resize(256, std::byte{0});
    std::vector<float> want(256), got(256);
    kv_decode_f32(dtype::fp8_e4m3, codes.data(), want.data(), 256);
    kernels.decode_rows[static_cast<int>(dtype::fp8_e4m3)](codes.data(), 256, got.data());
    for (int c = 0; c < 256; ++c) ASSERT_EQ(got[c], want[c]) << level_name(level) << " fp8 code " << c;
  }
}

TEST(cpu_kv_pool, writes_slots_in_the_documented_layout) {
  model_config config;
  config.num_layers = 2;
  config.num_kv_heads = 2;
  config.head_dim = 3;
  cpu::kv_pool kv(config, {4, 2}, dtype::f32);
  EXPECT_EQ(kv.num_slots(), 8);
  EXPECT_EQ(cpu::kv_pool::bytes_per_block(config, 2, dtype::f32), size_t{2 * 2 * 2 * 2 * 3 * 4});
  const std::vector<float> k = {1, 2, 3, 4, 5, 6}, v = {7, 8, 9, 10, 11, 12};
  const int64_t slot = 5;  // block 2, offset 1
  kv.write(1, k.data(), v.data(), 6, &slot, 1);
  auto at = [](const std::byte* pool, int64_t index) {
    float value;
    std::memcpy(&value, pool + 4 * index, 4);
    return value;
  };
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(at(kv.keys(1), (2 * 2 + 1) * 6 + i), k[i]);
    EXPECT_EQ(at(kv.values(1), (2 * 2 + 1) * 6 + i), v[i]);
    EXPECT_EQ(at(kv.keys(0), (2 * 2 + 1) * 6 + i), 0.0f);
  }
  const int64_t bad = 8;
  EXPECT_THROW(kv.write(0, k.data(), v.data(), 6, &bad, 1), std::runtime_error);

  // f16: the same slot, two bytes an element.
  cpu::kv_pool half(config, {4, 2}, dtype::f16);
  half.write(1, k.data(), v.data(), 6, &slot, 1);
  for (int i = 0; i < 6; ++i) {
    uint16_t bits;
    std::memcpy(&bits, half.keys(1) + 2 * ((2 * 2 + 1) * 6 + i), 2);
    EXPECT_EQ(f16_to_f32(bits), k[i]);
  }
}

TEST(cpu_kv_pool, block_capacity_follows_the_element_size) {
  model_config config;
  config.num_layers = 4;
  config.num_heads = 8;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  const size_t budget = size_t{64} << 20;
  const int f32 = cpu_kv_blocks_for_budget(config, budget, 16, dtype::f32);
  const int f16 = cpu_kv_blocks_for_budget(config, budget, 16, dtype::f16);
  const int fp8 = cpu_kv_blocks_for_budget(config, budget, 16, dtype::fp8_e4m3);
  const int q8 = cpu_kv_blocks_for_budget(config, budget, 16, dtype::q8_0);
  EXPECT_EQ(f16, 2 * f32);
  EXPECT_EQ(fp8, 2 * f16);
  EXPECT_EQ(q8, static_cast<int>(budget / (size_t{4} * 2 * 16 * 2 * 2 * 34)));  // 34 bytes per 32 elements
  EXPECT_EQ(cpu_kv_blocks_for_budget(config, budget, 16, dtype::bf16), f16);

  // q8_0 blocks of 32 must not straddle heads: head_dim 80 is refused by name.
  config.head_dim = 80;
  try {
    cpu::kv_pool pool(config, {4, 16}, dtype::q8_0);
    FAIL() << "q8_0 with head_dim 80 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 80"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpu::kv_pool(config, {4, 16}, dtype::q4_0), std::invalid_argument);
}

// One attention problem: sequences with (context, new tokens), KV written through the pool in
// `kv`, blocks scattered at random.
struct attention_case {
  int head_dim = 64;
  int num_kv_heads = 1;
  int group = 1;
  int block_size = 16;
  dtype kv = dtype::f16;
  std::vector<int> context;
  std::vector<int> num_new;
  float q_scale = 1.0f;  // > 1 makes the softmax peaky
  int threads = 2;
  double tolerance = 2e-5;  // of max |reference|
  int window = 0;           // > 0: a sliding layer's window
  float softcap = 0.0f;     // > 0: Gemma 2's soft-capping of the scores
  bool sinks = false;       // random per-head sink logits (gpt-oss)
};

std::string describe(const attention_case& c) {
  std::string text = "head_dim " + std::to_string(c.head_dim) + ", kv heads " + std::to_string(c.num_kv_heads) +
                     ", group " + std::to_string(c.group) + ", block " + std::to_string(c.block_size) + ", " +
                     std::string(dtype_name(c.kv)) + ", (context, new):";
  for (size_t s = 0; s < c.context.size(); ++s)
    text += " (" + std::to_string(c.context[s]) + ", " + std::to_string(c.num_new[s]) + ")";
  if (c.window > 0) text += ", window " + std::to_string(c.window);
  if (c.softcap > 0) text += ", softcap " + std::to_string(c.softcap);
  if (c.sinks) text += ", sinks";
  return text;
}

// The one layer whose KV pool a case fills.
model_config one_layer_config(const attention_case& c) {
  model_config config;
  config.num_layers = 1;
  config.num_kv_heads = c.num_kv_heads;
  config.num_heads = c.num_kv_heads * c.group;
  config.head_dim = c.head_dim;
  return config;
}

void expect_matches_reference(const attention_case& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  const model_config config = one_layer_config(c);
  const int hd = c.head_dim, slot = c.num_kv_heads * hd, q_dim = config.num_heads * hd;
  int num_blocks = 0;
  for (int context : c.context) num_blocks += (context + c.block_size - 1) / c.block_size;
  num_blocks += 3;  // never all of the pool
  cpu::kv_pool kv(config, {num_blocks, c.block_size}, c.kv);

  std::mt19937 rng(seed);
  std::vector<int32_t> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);

  forward_batch batch;
  batch.query_start.push_back(0);
  batch.block_table_start.push_back(0);
  std::vector<std::vector<double>> seq_k, seq_v;  // [context, slot]: what the pool holds, as double
  const size_t slot_bytes = kv_bytes(c.kv, slot);
  for (size_t s = 0; s < c.context.size(); ++s) {
    const int context = c.context[s];
    for (int b = 0; b < (context + c.block_size - 1) / c.block_size; ++b) {
      batch.block_tables.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
    const auto k = test::random_floats(size_t(context) * slot, seed * 31 + 2 * s);
    const auto v = test::random_floats(size_t(context) * slot, seed * 31 + 2 * s + 1);
    std::vector<int64_t> slots(context);
    for (int t = 0; t < context; ++t) {
      slots[t] = int64_t{batch.block_tables[batch.block_table_start.back() + t / c.block_size]} * c.block_size +
                 t % c.block_size;
    }
    kv.write(0, k.data(), v.data(), slot, slots.data(), context);
    seq_k.emplace_back(size_t(context) * slot);
    seq_v.emplace_back(size_t(context) * slot);
    std::vector<float> row(slot);
    for (int t = 0; t < context; ++t) {
      kv_decode_f32(c.kv, kv.keys(0) + slots[t] * slot_bytes, row.data(), slot);
      std::copy(row.begin(), row.end(), seq_k[s].begin() + size_t(t) * slot);
      kv_decode_f32(c.kv, kv.values(0) + slots[t] * slot_bytes, row.data(), slot);
      std::copy(row.begin(), row.end(), seq_v[s].begin() + size_t(t) * slot);
    }
    batch.block_table_start.push_back(static_cast<int32_t>(batch.block_tables.size()));
    batch.query_start.push_back(batch.query_start.back() + c.num_new[s]);
    batch.context_lengths.push_back(context);
  }
  const int tokens = batch.query_start.back();
  batch.token_ids.assign(tokens, 0);
  const auto q = test::random_floats(size_t(tokens) * q_dim, seed * 31 + 99, c.q_scale);
  const float scale = 1.0f / std::sqrt(float(hd));
  // Sinks of order 1 to 4 compete with the scores: some rows give them most of the weight.
  std::vector<float> sinks = test::random_floats(config.num_heads, seed * 31 + 77, 4.0f);
  cpu::attention_params params{config.num_heads, c.num_kv_heads, hd, c.block_size, num_blocks, scale, c.kv};
  params.window = c.window;
  params.softcap = c.softcap;
  params.sinks = c.sinks ? sinks.data() : nullptr;
  cpu::check_attention_batch(batch, params);

  std::vector<double> expected(size_t(tokens) * q_dim);
  double max_ref = 0;
  for (size_t s = 0; s < c.context.size(); ++s) {
    for (int i = 0; i < c.num_new[s]; ++i) {
      const int row = batch.query_start[s] + i;
      const int visible = c.context[s] - c.num_new[s] + i + 1;  // keys first .. visible - 1 (position visible - 1)
      const int first = c.window > 0 ? std::max(0, visible - c.window) : 0;
      std::vector<double> scores(visible);
      for (int h = 0; h < config.num_heads; ++h) {
        const int g = h / c.group;
        const double sink = c.sinks ? double(sinks[h]) : -INFINITY;
        double max_score = sink;
        for (int t = first; t < visible; ++t) {
          double dot = 0;
          for (int d = 0; d < hd; ++d)
            dot += double(q[size_t(row) * q_dim + h * hd + d]) * seq_k[s][size_t(t) * slot + g * hd + d];
          scores[t] = dot * scale;
          if (c.softcap > 0) scores[t] = c.softcap * std::tanh(scores[t] / c.softcap);
          max_score = std::max(max_score, scores[t]);
        }
        double total = std::exp(sink - max_score);
        for (int t = first; t < visible; ++t) total += (scores[t] = std::exp(scores[t] - max_score));
        for (int d = 0; d < hd; ++d) {
          double acc = 0;
          for (int t = first; t < visible; ++t) acc += scores[t] * seq_v[s][size_t(t) * slot + g * hd + d];
          expected[size_t(row) * q_dim + h * hd + d] = acc / total;
          max_ref = std::max(max_ref, std::fabs(acc / total));
        }
      }
    }
  }
  cpu::thread_pool pool(c.threads);
  for (cpu::simd_level level : supported_simd_levels()) {
    scoped_simd_level force(level);
    cpu::attention_workspace workspace;
    for (int repeat = 0; repeat < 2; ++repeat) {  // the second call reuses the workspace
      std::vector<float> out(size_t(tokens) * q_dim, -7.0f);
      cpu::paged_attention(pool, q.data(), q_dim, kv.keys(0), kv.values(0), batch, params, out.data(), q_dim,
                           workspace);
      double max_error = 0;
      size_t worst = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        const double error = std::fabs(out[i] - expected[i]);
        if (!(error <= max_error)) {  // NaN counts as worst
          max_error = std::isnan(error) ? std::numeric_limits<double>::infinity() : error;
          worst = i;
        }
      }
      ASSERT_LE(max_error, c.tolerance * max_ref)
          << level_name(level) << ": element " << worst << " (token " << worst / q_dim << ", head "
          << (worst % q_dim) / hd << ") is " << out[worst] << ", expected " << expected[worst];
    }
  }
}

// A decode, a chunked prefill (cached context + a chunk), a fresh prompt and a few speculative
// tokens, in one batch.
attention_case mixed_batch(int head_dim, int group, dtype kv, int block_size) {
  attention_case c;
  c.head_dim = head_dim;
  c.group = group;
  c.num_kv_heads = group <= 4 ? 2 : 1;
  c.kv = kv;
  c.block_size = block_size;
  c.context = {131, 97, 45, 70};
  c.num_new = {1, 33, 45, 5};
  return c;
}

TEST(cpu_paged_attention, every_head_size_and_gqa_ratio) {
  uint32_t seed = 1;
  for (int head_dim : {64, 80, 96, 128, 256}) {
    for (int group = 1; group <= 8; ++group)
      expect_matches_reference(mixed_batch(head_dim, group, dtype::f16, 16), seed++);
  }
}

TEST(cpu_paged_attention, every_kv_dtype) {
  uint32_t seed = 100;
  for (dtype kv : all_kv_types) {
    for (int head_dim : {64, 128}) {
      for (int group : {1, 4, 8}) {
        attention_case c = mixed_batch(head_dim, group, kv, 16);
        c.q_scale = 3.0f;  // peaky: the quantized values' softmax is not flattened into hiding errors
        expect_matches_reference(c, seed++);
      }
    }
    if (kv != dtype::q8_0) expect_matches_reference(mixed_batch(80, 2, kv, 16), seed++);
  }
}

TEST(cpu_paged_attention, block_boundaries) {
  uint32_t seed = 200;
  for (int block_size : {1, 7, 16, 32}) {
    attention_case c;
    c.head_dim = 64;
    c.group = 4;
    c.num_kv_heads = 1;
    c.block_size = block_size;
    // Contexts one short of, at, and one past block and key-tile boundaries; chunks ending there.
    c.context = {31, 32, 33, 63, 64, 65, 48, 97};
    c.num_new = {1, 1, 1, 3, 16, 17, 48, 32};
    expect_matches_reference(c, seed++);
  }
}

TEST(cpu_paged_attention, long_contexts_split_across_threads) {
  uint32_t seed = 300;
  for (int context : {4095, 4096, 4097, 32768}) {
    attention_case c;
    c.head_dim = 128;
    c.group = 4;
    c.num_kv_heads = 1;
    c.context = {context};
    c.num_new = {1};
    c.q_scale = 2.0f;
    expect_matches_reference(c, seed++);  // one decode on 2 threads: its keys split in 8
  }
  // A chunk of a long prompt and a decode beside it; three threads.
  attention_case c;
  c.head_dim = 64;
  c.group = 2;
  c.num_kv_heads = 2;
  c.context = {32768, 20000};
  c.num_new = {40, 1};
  c.threads = 3;
  expect_matches_reference(c, seed++);
}

// Each variant of the softmax alone and all together, on decodes, chunked prefills, speculative
// tokens and contexts long enough to be split across threads: a window shorter than the context
// (and one longer), Gemma 2's soft-capping with peaky queries (scores far past the cap), and
// gpt-oss's sinks.
TEST(cpu_paged_attention, windows_soft_capping_and_sinks) {
  uint32_t seed = 400;
  struct variant {
    int window;
    float softcap;
    bool sinks;
  };
  for (const variant v : {variant{40, 0, false}, variant{1, 0, false}, variant{500, 0, false}, variant{0, 5.0f, false},
                          variant{0, 0, true}, variant{33, 5.0f, true}}) {
    for (dtype kv : {dtype::f32, dtype::f16}) {
      for (int group : {1, 4, 8}) {
        attention_case c = mixed_batch(64, group, kv, 16);
        c.window = v.window;
        c.softcap = v.softcap;
        c.sinks = v.sinks;
        c.q_scale = v.softcap > 0 ? 6.0f : 2.0f;
        expect_matches_reference(c, seed++);
      }
    }
    // A long decode split across threads, a long chunk and a decode beside it: the window
    // starts keys far into the context, where a split's first range may hold none of them.
    for (const auto& [context, num_new] :
         {std::pair<std::vector<int>, std::vector<int>>{{4097, 1200}, {1, 3}}, {{3000, 900}, {70, 1}}}) {
      attention_case c;
      c.head_dim = 128;
      c.group = 4;
      c.num_kv_heads = 2;
      c.context = context;
      c.num_new = num_new;
      c.window = v.window == 0 ? 0 : v.window * 30;
      c.softcap = v.softcap;
      c.sinks = v.sinks;
      c.q_scale = 2.0f;
      c.threads = 3;
      expect_matches_reference(c, seed++);
    }
  }
}

// Bit invariance (paged_attention_kernels.hpp): one sequence's prompt run whole, as decode steps
// one token at a time, in random chunks and in chunks that fill the tiled kernel, on 1 to 4
// threads (decodes split across threads at partition boundaries), alone or beside another
// sequence in the batch: every query's output has the same bits each way.
struct cutting {
  std::vector<int> chunks;  // sizes, summing to the context
  int threads = 1;
  bool beside_another = false;  // a decode of another sequence rides in every call
  std::string name;
};

std::vector<float> attention_cut(const cutting& cut, const attention_case& c, const cpu::kv_pool& kv,
                                 const std::vector<int32_t>& blocks, const std::vector<int32_t>& other_blocks,
                                 int other_context, const std::vector<float>& q, const cpu::attention_params& params) {
  const int q_dim = c.num_kv_heads * c.group * c.head_dim;
  const int context = c.context[0];
  std::vector<float> result(size_t(context) * q_dim);
  cpu::thread_pool pool(cut.threads);
  cpu::attention_workspace workspace;
  int done = 0;
  for (int chunk : cut.chunks) {
    forward_batch batch;
    batch.query_start = {0, chunk};
    batch.context_lengths = {done + chunk};
    batch.block_tables = blocks;
    batch.block_table_start = {0, static_cast<int32_t>(blocks.size())};
    std::vector<float> queries(q.begin() + size_t(done) * q_dim, q.begin() + size_t(done + chunk) * q_dim);
    if (cut.beside_another) {
      batch.query_start.push_back(chunk + 1);
      batch.context_lengths.push_back(other_context);
      batch.block_tables.insert(batch.block_tables.end(), other_blocks.begin(), other_blocks.end());
      batch.block_table_start.push_back(static_cast<int32_t>(batch.block_tables.size()));
      queries.insert(queries.end(), q.begin(), q.begin() + q_dim);
    }
    batch.token_ids.assign(batch.query_start.back(), 0);
    std::vector<float> out(queries.size());
    cpu::paged_attention(pool, queries.data(), q_dim, kv.keys(0), kv.values(0), batch, params, out.data(), q_dim,
                         workspace);
    std::copy(out.begin(), out.begin() + size_t(chunk) * q_dim, result.begin() + size_t(done) * q_dim);
    done += chunk;
  }
  return result;
}

void expect_the_same_bits_however_cut(const attention_case& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  const model_config config = one_layer_config(c);
  const int context = c.context[0], other_context = 300;
  const int slot = c.num_kv_heads * c.head_dim, q_dim = config.num_heads * c.head_dim;
  const int own_blocks = (context + c.block_size - 1) / c.block_size;
  const int num_blocks = own_blocks + (other_context + c.block_size - 1) / c.block_size;
  cpu::kv_pool kv(config, {num_blocks, c.block_size}, c.kv);
  std::mt19937 rng(seed);
  std::vector<int32_t> shuffled(num_blocks);
  std::iota(shuffled.begin(), shuffled.end(), 0);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  const std::vector<int32_t> blocks(shuffled.begin(), shuffled.begin() + own_blocks);
  const std::vector<int32_t> other_blocks(shuffled.begin() + own_blocks, shuffled.end());
  auto fill = [&](const std::vector<int32_t>& table, int length, uint32_t key_seed) {
    const auto k = test::random_floats(size_t(length) * slot, key_seed);
    const auto v = test::random_floats(size_t(length) * slot, key_seed + 1);
    std::vector<int64_t> slots(length);
    for (int t = 0; t < length; ++t) slots[t] = int64_t{table[t / c.block_size]} * c.block_size + t % c.block_size;
    kv.write(0, k.data(), v.data(), slot, slots.data(), length);
  };
  fill(blocks, context, seed * 7);
  fill(other_blocks, other_context, seed * 7 + 2);
  const auto q = test::random_floats(size_t(context) * q_dim, seed * 7 + 4, c.q_scale);
  const std::vector<float> sinks = test::random_floats(config.num_heads, seed * 7 + 5, 4.0f);
  cpu::attention_params params{config.num_heads,
                               c.num_kv_heads,
                               c.head_dim,
                               c.block_size,
                               num_blocks,
                               1.0f / std::sqrt(float(c.head_dim)),
                               c.kv};
  params.window = c.window;
  params.softcap = c.softcap;
  params.sinks = c.sinks ? sinks.data() : nullptr;

  std::vector<cutting> cuts;
  cuts.push_back({{context}, 1, false, "whole, 1 thread"});
  cuts.push_back({{context}, 2, true, "whole beside a decode, 2 threads"});
  cuts.push_back({std::vector<int>(context, 1), 2, false, "decode steps, 2 threads"});
  cuts.push_back({std::vector<int>(context, 1), 1, true, "decode steps beside a decode, 1 thread"});
  cuts.push_back({std::vector<int>(context, 1), 4, false, "decode steps, 4 threads"});
  std::vector<int> random_chunks;
  std::uniform_int_distribution<int> size(1, 80);
  for (int covered = 0; covered < context; covered += random_chunks.back()) {
    random_chunks.push_back(std::min(size(rng), context - covered));
  }
  cuts.push_back({random_chunks, 3, true, "random chunks beside a decode, 3 threads"});
  std::vector<int> even_chunks;
  for (int covered = 0; covered < context; covered += even_chunks.back())
    even_chunks.push_back(std::min(64, context - covered));
  cuts.push_back({even_chunks, 2, false, "chunks of 64, 2 threads"});

  for (cpu::simd_level level : supported_simd_levels()) {
    scoped_simd_level force(level);
    const std::vector<float> first = attention_cut(cuts[0], c, kv, blocks, other_blocks, other_context, q, params);
    for (size_t i = 1; i < cuts.size(); ++i) {
      const std::vector<float> other = attention_cut(cuts[i], c, kv, blocks, other_blocks, other_context, q, params);
      size_t differ = 0, first_differ = 0;
      for (size_t e = 0; e < first.size(); ++e) {
        if (std::memcmp(&first[e], &other[e], sizeof(float)) != 0 && differ++ == 0) first_differ = e;
      }
      EXPECT_EQ(differ, 0u) << level_name(level) << ", " << cuts[i].name << ": " << differ << " of " << first.size()
                            << " outputs differ from the whole prompt's, the first at token " << first_differ / q_dim
                            << " (" << other[first_differ] << " against " << first[first_differ] << ")";
    }
  }
}

TEST(cpu_paged_attention, a_querys_output_has_the_same_bits_however_the_step_is_cut) {
  uint32_t seed = 500;
  struct variant {
    int head_dim, group, num_kv_heads, block_size;
    dtype kv;
    int window;
    float softcap;
    bool sinks;
  };
  for (const variant v :
       {variant{64, 4, 2, 16, dtype::f16, 0, 0, false}, variant{80, 1, 2, 7, dtype::f32, 0, 0, false},
        variant{128, 8, 1, 16, dtype::q8_0, 300, 30.0f, true}, variant{64, 2, 1, 32, dtype::bf16, 100, 0, false},
        variant{96, 3, 1, 16, dtype::fp8_e4m3, 0, 0, true}}) {
    attention_case c;
    c.head_dim = v.head_dim;
    c.group = v.group;
    c.num_kv_heads = v.num_kv_heads;
    c.block_size = v.block_size;
    c.kv = v.kv;
    c.window = v.window;
    c.softcap = v.softcap;
    c.sinks = v.sinks;
    c.q_scale = 2.0f;
    c.context = {700};  // past two partition boundaries (256, 512)
    c.num_new = {700};
    expect_the_same_bits_however_cut(c, seed++);
  }
}

TEST(cpu_paged_attention, refuses_inconsistent_batches) {
  forward_batch batch;
  batch.token_ids = {0, 0};
  batch.query_start = {0, 1, 2};
  batch.context_lengths = {5, 40};
  batch.block_table_start = {0, 2, 12};
  batch.block_tables = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const cpu::attention_params params{2, 1, 8, 4, 12, 0.5f, dtype::f16};
  cpu::check_attention_batch(batch, params);
  forward_batch short_table = batch;
  short_table.context_lengths[1] = 41;  // needs 11 blocks, has 10
  EXPECT_THROW(cpu::check_attention_batch(short_table, params), std::runtime_error);
  forward_batch bad_block = batch;
  bad_block.block_tables[0] = 12;
  EXPECT_THROW(cpu::check_attention_batch(bad_block, params), std::runtime_error);
  forward_batch too_many_new = batch;
  too_many_new.query_start = {0, 6, 7};
  too_many_new.token_ids.assign(7, 0);
  EXPECT_THROW(cpu::check_attention_batch(too_many_new, params), std::runtime_error);
}

}  // namespace
}  // namespace troupe
