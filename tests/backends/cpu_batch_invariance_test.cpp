// A sequence's logits must not depend on what else rides in its batch: several sequences of
// different lengths, prompts cut into chunks over several forward calls, KV blocks scattered
// at random over the pool, decode tokens mixed with prefill chunks, give the same logits as
// each sequence run alone (relative error <= 1e-5 with an f32 KV cache). With the default f16
// cache the bound is 1e-3: a K or V computed by another matmul path (a prompt at once, or in
// chunks) differs in its last f32 bits, which now and then rounds to the neighbouring f16 value
// (measured: up to 3.5e-5); a batching mistake (a wrong block, a wrong context) is off by O(1).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>

#include "backends/cpu/cpu_model.hpp"
#include "backends/cpu/matmul.hpp"
#include "model/loader/dummy_weights.hpp"
#include "model/loader/model_loader.hpp"
#include "tests/backends/cpu_greedy_support.hpp"
#include "tests/backends/cpu_test_support.hpp"
#include "tests/backends/quant_test_support.hpp"

namespace troupe {
namespace {

struct sequence_plan {
  std::vector<int32_t> tokens;  // prompt followed by the tokens fed as decode steps
  int prompt_length = 0;
  // How the batched run cuts the prompt (sizes, in order); the run alone takes the whole prompt
  // in one forward.
  std::vector<int> prompt_chunks;
  // Logits after each token from prompt_length - 1 on, when the sequence runs alone.
  std::vector<std::vector<float>> alone_logits;
  // Filled in the batched run, in the same order.
  std::vector<std::vector<float>> batched_logits;
  std::vector<int32_t> blocks;
  int computed = 0;
  size_t next_chunk = 0;  // the batched run's place in prompt_chunks
};

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(double(want[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

// Runs the sequence alone in a fresh model: the prompt in one forward, then one token at a time.
void run_alone(const model_config& config, const weight_store& weights, dtype kv_dtype, sequence_plan& seq) {
  const int block_size = 4;
  auto m = make_cpu_model(config, weights, {64, block_size}, 2, kv_dtype);
  std::vector<float> logits(config.vocab_size);
  const int total = static_cast<int>(seq.tokens.size());
  int computed = 0;
  auto end_of_next = [&](int from) { return from >= seq.prompt_length ? from + 1 : seq.prompt_length; };
  int end = end_of_next(0);
  std::vector<int32_t> blocks(64);
  std::iota(blocks.begin(), blocks.end(), 0);
  while (computed < total) {
    forward_batch batch;
    for (int t = computed; t < end; ++t) {
      batch.token_ids.push_back(seq.tokens[t]);
      batch.positions.push_back(t);
      batch.slot_mapping.push_back(t);
    }
    batch.query_start = {0, end - computed};
    batch.context_lengths = {end};
    batch.block_table_start = {0, 64};
    batch.block_tables = blocks;
    batch.logits_rows = {end - computed - 1};
    m->forward(batch, logits.data());
    if (end >= seq.prompt_length) seq.alone_logits.push_back(logits);
    computed = end;
    end = end_of_next(computed);
  }
}

void expect_batch_invariance(const model_config& config, const weight_store& weights, uint32_t seed,
                             dtype kv_dtype = dtype::f32, double tolerance = 1e-5) {
  SCOPED_TRACE(std::string("KV cache ") + std::string(dtype_name(kv_dtype)));
  std::mt19937 rng(seed);
  const std::vector<int> prompt_lengths = {13, 1, 29, 6, 20};
  const int decode_steps = 6;
  std::vector<sequence_plan> seqs(prompt_lengths.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    std::uniform_int_distribution<int> token(3, config.vocab_size - 1);
    seqs[s].prompt_length = prompt_lengths[s];
    for (int i = 0; i < prompt_lengths[s] + decode_steps; ++i) seqs[s].tokens.push_back(token(rng));
    std::uniform_int_distribution<int> chunk(1, 9);
    for (int covered = 0; covered < prompt_lengths[s];) {
      seqs[s].prompt_chunks.push_back(chunk(rng));
      covered += seqs[s].prompt_chunks.back();
    }
    run_alone(config, weights, kv_dtype, seqs[s]);
  }

  const int block_size = 4, num_blocks = 80;
  std::vector<int32_t> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  for (auto& seq : seqs) {
    const int needed = (static_cast<int>(seq.tokens.size()) + block_size - 1) / block_size;
    for (int b = 0; b < needed; ++b) {
      seq.blocks.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
  }
  auto m = make_cpu_model(config, weights, {num_blocks, block_size}, 2, kv_dtype);
  std::bernoulli_distribution skip(0.25);
  for (int step = 0; step < 200; ++step) {
    forward_batch batch;
    batch.query_start.push_back(0);
    batch.block_table_start.push_back(0);
    std::vector<size_t> wants_logits;
    for (size_t s = 0; s < seqs.size(); ++s) {
      sequence_plan& seq = seqs[s];
      const int total = static_cast<int>(seq.tokens.size());
      if (seq.computed >= total || skip(rng)) continue;
      // Prefill in the sequence's random chunks (never past the prompt), then one token per step.
      const int end = seq.computed < seq.prompt_length
                          ? std::min(seq.prompt_length, seq.computed + seq.prompt_chunks.at(seq.next_chunk++))
                          : seq.computed + 1;
      for (int t = seq.computed; t < end; ++t) {
        batch.token_ids.push_back(seq.tokens[t]);
        batch.positions.push_back(t);
        batch.slot_mapping.push_back(int64_t{seq.blocks[t / block_size]} * block_size + t % block_size);
      }
      batch.query_start.push_back(batch.num_tokens());
      batch.context_lengths.push_back(end);
      batch.block_tables.insert(batch.block_tables.end(), seq.blocks.begin(), seq.blocks.end());
      batch.block_table_start.push_back(static_cast<int32_t>(batch.block_tables.size()));
      if (end >= seq.prompt_length) {
        batch.logits_rows.push_back(batch.num_tokens() - 1);
        wants_logits.push_back(s);
      }
      seq.computed = end;
    }
    if (batch.num_seqs() == 0) {
      bool done = std::all_of(seqs.begin(), seqs.end(),
                              [](const sequence_plan& q) { return q.computed >= static_cast<int>(q.tokens.size()); });
      if (done) break;
      continue;
    }
    std::vector<float> logits(static_cast<size_t>(batch.num_logits()) * config.vocab_size);
    m->forward(batch, logits.data());
    for (size_t i = 0; i < wants_logits.size(); ++i) {
      seqs[wants_logits[i]].batched_logits.emplace_back(logits.begin() + i * config.vocab_size,
                                                        logits.begin() + (i + 1) * config.vocab_size);
    }
  }
  for (size_t s = 0; s < seqs.size(); ++s) {
    ASSERT_EQ(seqs[s].batched_logits.size(), seqs[s].alone_logits.size()) << "sequence " << s;
    for (size_t i = 0; i < seqs[s].alone_logits.size(); ++i) {
      EXPECT_LE(relative_error(seqs[s].batched_logits[i], seqs[s].alone_logits[i]), tolerance)
          << "sequence " << s << ", logits " << i;
    }
  }
}

TEST(cpu_batch_invariance, stories260k_mixed_chunked_batches_match_each_sequence_alone) {
  const loaded_model loaded = load_model(load_options{std::string(TROUPE_SHARED_DIR) + "/models/stories260K/hf"});
  expect_batch_invariance(loaded.config, loaded.weights, 1);
  expect_batch_invariance(loaded.config, loaded.weights, 1, dtype::f16, 1e-3);
}

// Float weights through the row-dot path at every row count (as below 32 rows): those dots give a
// row the same bits alone or beside others, and so does attention however the step is cut, so
// the logits are exact with either cache; only sgemm (32 rows and more) rounds differently.
TEST(cpu_batch_invariance, stories260k_is_exact_when_every_product_takes_the_row_dots) {
  const loaded_model loaded = load_model(load_options{std::string(TROUPE_SHARED_DIR) + "/models/stories260K/hf"});
  const int saved = cpu::matmul_gemm_min_rows();
  cpu::set_matmul_gemm_min_rows(INT32_MAX);
  expect_batch_invariance(loaded.config, loaded.weights, 1, dtype::f32, 0.0);
  expect_batch_invariance(loaded.config, loaded.weights, 1, dtype::f16, 0.0);
  cpu::set_matmul_gemm_min_rows(saved);
}

// --batch-invariant: float weights take the row dots at every count, blocked for the caches
// from matmul_gemm_min_rows rows on (moved down to 8 here, so that most of the plan's batches go
// that way, where sgemm would round differently), so float models are exact with either cache.
TEST(cpu_batch_invariance, float_models_are_exact_with_the_row_dots_at_every_count) {
  const loaded_model loaded = load_model(load_options{std::string(TROUPE_SHARED_DIR) + "/models/stories260K/hf"});
  model_config config;
  config.arch = architecture::qwen3;
  config.hidden_size = 64;
  config.intermediate_size = 96;
  config.num_layers = 2;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 32;
  config.vocab_size = 300;
  config.max_position_embeddings = 256;
  config.rope_theta = 1000000.0f;
  config.qk_norm = true;
  const weight_store f16_weights = make_dummy_weights(config, dtype::f16, 7, {0.08f, 0.1f});
  const weight_store bf16_weights = make_dummy_weights(config, dtype::bf16, 8, {0.08f, 0.1f});
  const int saved = cpu::matmul_gemm_min_rows();
  cpu::set_matmul_gemm_min_rows(8);
  cpu::set_matmul_float_rows_at_every_count(true);
  EXPECT_TRUE(cpu::matmul_batch_invariant(dtype::f16));
  for (dtype kv : {dtype::f32, dtype::f16}) {
    expect_batch_invariance(loaded.config, loaded.weights, 1, kv, 0.0);
    expect_batch_invariance(config, f16_weights, 2, kv, 0.0);
    expect_batch_invariance(config, bf16_weights, 3, kv, 0.0);
  }
  cpu::set_matmul_float_rows_at_every_count(false);
  cpu::set_matmul_gemm_min_rows(saved);
  EXPECT_FALSE(cpu::matmul_batch_invariant(dtype::f16));
}

TEST(cpu_batch_invariance, random_qwen3_f16_model_mixed_batches_match_each_sequence_alone) {
  model_config config;
  config.arch = architecture::qwen3;
  config.hidden_size = 64;
  config.intermediate_size = 96;
  config.num_layers = 2;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 32;  // q_dim 128 != hidden 64, as Qwen3 allows
  config.vocab_size = 300;
  config.max_position_embeddings = 256;
  config.rope_theta = 1000000.0f;
  config.qk_norm = true;
  const weight_store weights = make_dummy_weights(config, dtype::f16, 7, {0.08f, 0.1f});
  expect_batch_invariance(config, weights, 2);
  expect_batch_invariance(config, weights, 2, dtype::f16, 1e-3);
}

TEST(cpu_batch_invariance, random_qwen2_q8_0_model_with_bias_matches_each_sequence_alone) {
  model_config config;
  config.arch = architecture::qwen2;
  config.hidden_size = 64;
  config.intermediate_size = 128;
  config.num_layers = 2;
  config.num_heads = 4;
  config.num_kv_heads = 1;
  config.head_dim = 16;
  config.vocab_size = 256;
  config.max_position_embeddings = 256;
  config.attention_bias = true;
  config.tie_word_embeddings = true;
  const weight_store weights = make_dummy_weights(config, dtype::q8_0, 9, {0.08f, 0.1f});
  expect_batch_invariance(config, weights, 3, dtype::f32, 0.0);  // integer kernels: exact (below)
  expect_batch_invariance(config, weights, 3, dtype::f16, 0.0);
}

// Quantized weights: every matmul path (any row count, any split) gives a row the same bits, and
// so does attention however a step is cut (paged_attention_kernels.hpp, "Bit invariance"): a
// sequence's logits are bitwise those of the sequence alone, its prompt whole, with either KV
// cache. (The integer kernels quantize each activation row to int8, so a last-bit difference
// anywhere upstream would show as a whole quantization step.)
TEST(cpu_batch_invariance, stories260k_q4_0_matches_each_sequence_alone) {
  if (!testing::ggml_oracle::available()) GTEST_SKIP() << "the npm oracles are not installed";
  const loaded_model loaded = load_model(load_options{std::string(TROUPE_SHARED_DIR) + "/models/stories260K/hf"});
  const test::quantized_pair pair = test::quantize_store(loaded.weights, dtype::q4_0);
  expect_batch_invariance(loaded.config, pair.quantized, 4, dtype::f32, 0.0);
  expect_batch_invariance(loaded.config, pair.quantized, 4, dtype::f16, 0.0);
}

// Q4_K and Q8_0 (both repacked at load, as stories260K's Q4_0 above).
TEST(cpu_batch_invariance, random_llama_q4_k_and_q8_0_match_each_sequence_alone) {
  if (!testing::ggml_oracle::available()) GTEST_SKIP() << "the npm oracles are not installed";
  const model_config config = test::k_quant_llama_config(512, 2, 300);
  const weight_store weights = make_dummy_weights(config, dtype::f32, 11, {0.08f, 0.1f});
  for (dtype type : {dtype::q4_k, dtype::q8_0}) {
    SCOPED_TRACE(dtype_name(type));
    const test::quantized_pair pair = test::quantize_store(weights, type);
    expect_batch_invariance(config, pair.quantized, 5, dtype::f32, 0.0);
    expect_batch_invariance(config, pair.quantized, 5, dtype::f16, 0.0);
  }
}

}  // namespace
}  // namespace troupe
