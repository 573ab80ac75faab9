// The whole model on the GPU: stories260K greedy decoding in f32 equals the reference outputs,
// and random models of every architecture agree with the CPU backend step by step (batched
// prefill, chunked prefill, padded decode batches that replay CUDA graphs).

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <numeric>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_model.hpp"
#include "model/loader/dummy_weights.hpp"
#include "model/loader/float_conversion.hpp"
#include "model/loader/model_loader.hpp"
#include "model/quant/quantize.hpp"
#include "tests/backends/cuda/cuda_test_util.hpp"
#include "tests/backends/cuda/random_quant_blocks.hpp"

namespace troupe {
namespace {

using namespace troupe::cuda::testing;

// Sequences fed to a model step by step, the way the engine's model_runner flattens them.
class batch_driver {
 public:
  batch_driver(int block_size, int num_blocks, uint32_t seed) : block_size_(block_size) {
    free_.resize(num_blocks);
    std::iota(free_.begin(), free_.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(free_.begin(), free_.end(), rng);  // block tables far from the identity
  }

  int add(std::vector<int32_t> prompt) {
    sequences_.push_back({std::move(prompt), 0, {}});
    return static_cast<int>(sequences_.size()) - 1;
  }
  std::vector<int32_t>& tokens(int seq) { return sequences_[seq].tokens; }
  // The sequences whose logits the last step asked for, in logits order.
  const std::vector<int>& logits_seqs() const { return logits_seqs_; }

  // One step: `chunks[i]` new tokens of sequence ids[i]. Logits are asked for every sequence
  // whose tokens are all computed after the step.
  forward_batch step(const std::vector<int>& ids, const std::vector<int>& chunks) {
    forward_batch b;
    logits_seqs_.clear();
    b.query_start.push_back(0);
    b.block_table_start.push_back(0);
    for (size_t i = 0; i < ids.size(); ++i) {
      sequence& s = sequences_[ids[i]];
      const int begin = s.computed, end = s.computed + chunks[i];
      while (static_cast<int>(s.blocks.size()) * block_size_ < end) {
        s.blocks.push_back(free_.back());
        free_.pop_back();
      }
      for (int t = begin; t < end; ++t) {
        b.token_ids.push_back(s.tokens[t]);
        b.positions.push_back(t);
        b.slot_mapping.push_back(int64_t{s.blocks[t / block_size_]} * block_size_ + t % block_size_);
      }
      b.query_start.push_back(b.num_tokens());
      b.context_lengths.push_back(end);
      b.block_tables.insert(b.block_tables.end(), s.blocks.begin(), s.blocks.end());
      b.block_table_start.push_back(static_cast<int32_t>(b.block_tables.size()));
      if (end == static_cast<int>(s.tokens.size())) {
        b.logits_rows.push_back(b.num_tokens() - 1);
        logits_seqs_.push_back(ids[i]);
      }
      s.computed = end;
    }
    return b;
  }

 private:
  struct sequence {
    std::vector<int32_t> tokens;
    int computed;
    std::vector<int32_t> blocks;
  };
  int block_size_;
  std::vector<int32_t> free_;
  std::vector<sequence> sequences_;
  std::vector<int> logits_seqs_;
};

// The shared models folder; TROUPE_SHARED_DIR in the environment overrides the build's path
// (a GPU machine that received a copy of the tree keeps the models somewhere else).
std::string shared_dir() {
  const char* env = std::getenv("TROUPE_SHARED_DIR");
  return env ? env : TROUPE_SHARED_DIR;
}

int argmax_row(const float* row, int vocab) { return static_cast<int>(std::max_element(row, row + vocab) - row); }

struct reference_prompt {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> generated_ids;
};

std::vector<reference_prompt> stories_references() {
  std::ifstream in(shared_dir() + "/models/stories260K/refs.json");
  const nlohmann::json refs = nlohmann::json::parse(in);
  std::vector<reference_prompt> out;
  for (const auto& r : refs.at("references")) {
    out.push_back({r.at("input_ids").get<std::vector<int32_t>>(), r.at("generated_ids").get<std::vector<int32_t>>()});
  }
  return out;
}

// All prompts together: one varlen prefill step, then batched decode steps (3 sequences pad to
// a graph bucket of 4; graphs are captured on the first decode step and replayed after).
void expect_stories_greedy(bool graphs, int prefill_chunk) {
  const loaded_model loaded = load_model(load_options{shared_dir() + "/models/stories260K/hf"});
  cuda_options options;
  options.activation = dtype::f32;
  options.cuda_graphs = graphs;
  auto gpu = make_cuda_model(loaded.config, loaded.weights, kv_cache_shape{64, 16}, options);
  const std::vector<reference_prompt> refs = stories_references();
  batch_driver driver(16, 64, 5);
  std::vector<int> ids;
  for (const auto& r : refs) ids.push_back(driver.add(r.input_ids));
  const int vocab = loaded.config.vocab_size;
  std::vector<float> logits(refs.size() * vocab);

  // Prefill, in chunks of `prefill_chunk` tokens per sequence per step.
  std::vector<int> done(refs.size(), 0);
  for (bool prefilling = true; prefilling;) {
    std::vector<int> chunk_ids, chunks;
    for (size_t i = 0; i < refs.size(); ++i) {
      const int left = static_cast<int>(refs[i].input_ids.size()) - done[i];
      if (left == 0) continue;
      chunk_ids.push_back(ids[i]);
      chunks.push_back(std::min(left, prefill_chunk));
      done[i] += chunks.back();
    }
    prefilling = !chunk_ids.empty();
    if (!prefilling) break;
    const forward_batch b = driver.step(chunk_ids, chunks);
    gpu->forward(b, logits.data());
    for (int r = 0; r < b.num_logits(); ++r) {
      driver.tokens(driver.logits_seqs()[r]).push_back(argmax_row(&logits[r * vocab], vocab));
    }
  }
  for (size_t step = 1; step < refs[0].generated_ids.size(); ++step) {
    const forward_batch b = driver.step(ids, std::vector<int>(ids.size(), 1));
    gpu->forward(b, logits.data());
    for (size_t i = 0; i < refs.size(); ++i) driver.tokens(ids[i]).push_back(argmax_row(&logits[i * vocab], vocab));
  }
  for (size_t i = 0; i < refs.size(); ++i) {
    const std::vector<int32_t>& all = driver.tokens(ids[i]);
    const std::vector<int32_t> generated(all.begin() + refs[i].input_ids.size(), all.end());
    EXPECT_EQ(generated, refs[i].generated_ids) << "prompt " << i << " graphs " << graphs << " chunk " << prefill_chunk;
  }
}

TEST(cuda_model, stories260k_greedy_f32_matches_references_with_graphs) {
  TROUPE_REQUIRE_GPU();
  expect_stories_greedy(true, 1000);
}

TEST(cuda_model, stories260k_greedy_f32_chunked_prefill_without_graphs) {
  TROUPE_REQUIRE_GPU();
  expect_stories_greedy(false, 2);
}

model_config tiny_config(architecture arch) {
  model_config c;
  c.arch = arch;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 320;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 10000.0f;
  c.bos_token_id = 1;
  switch (arch) {
    case architecture::llama:
      c.architecture_name = "LlamaForCausalLM";
      c.rope_theta = 500000.0f;
      c.rope_scaling = llama3_rope_scaling(8.0f, 1.0f, 4.0f, 64);  // short original context: every band scaled
      c.tie_word_embeddings = false;
      break;
    case architecture::mistral:
      c.architecture_name = "MistralForCausalLM";
      c.num_kv_heads = 1;
      c.tie_word_embeddings = false;
      break;
    case architecture::qwen2:
      c.architecture_name = "Qwen2ForCausalLM";
      c.attention_bias = true;
      c.tie_word_embeddings = true;
      break;
    case architecture::qwen3:
      c.architecture_name = "Qwen3ForCausalLM";
      c.qk_norm = true;
      c.head_dim = 64;  // wider than hidden / heads, as Qwen3 does
      c.tie_word_embeddings = true;
      break;
    default: throw std::invalid_argument("no CUDA test config for this architecture");
  }
  return c;
}

using step_list = std::vector<std::pair<std::vector<int>, std::vector<int>>>;  // (sequences, new tokens)

// Feeds `prompts` to the GPU model (with `options`) and the CPU backend through the same
// batches, `steps` over sequence indices, and compares every step's logits.
void compare_steps_with_cpu(const model_config& config, const weight_store& weights, const cuda_options& options,
                            const std::vector<int>& prompt_lengths, const step_list& steps, double allowed,
                            const std::string& label) {
  auto gpu = make_cuda_model(config, weights, kv_cache_shape{64, 8}, options);
  // The CPU's cache in the GPU's KV dtype: both then attend over the same rounded values.
  auto cpu = make_cpu_model(config, weights, kv_cache_shape{64, 8}, 2, options.kv_cache.value_or(options.activation));
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> token(2, config.vocab_size - 1);
  batch_driver driver(8, 64, 3);
  for (int length : prompt_lengths) {
    std::vector<int32_t> prompt(length);
    for (auto& t : prompt) t = token(rng);
    driver.add(prompt);
  }
  const int vocab = config.vocab_size;
  for (size_t s = 0; s < steps.size(); ++s) {
    const forward_batch batch = driver.step(steps[s].first, steps[s].second);
    std::vector<float> gpu_logits(batch.num_logits() * vocab), cpu_logits(batch.num_logits() * vocab);
    gpu->forward(batch, gpu_logits.data());
    cpu->forward(batch, cpu_logits.data());
    EXPECT_LT(normalized_error(gpu_logits, cpu_logits), allowed)
        << config.architecture_name << " " << label << " step " << s;
    // Both continue with the CPU's greedy choice so the batches stay identical.
    for (int r = 0; r < batch.num_logits(); ++r) {
      driver.tokens(driver.logits_seqs()[r]).push_back(argmax_row(&cpu_logits[r * vocab], vocab));
    }
  }
}

dummy_init test_init() {
  dummy_init init;
  init.stddev = 0.08f;
  init.norm_jitter = 0.3f;
  return init;
}

void compare_steps_with_cpu(const model_config& config, uint32_t weight_seed, dtype weight_type,
                            const cuda_options& options, const std::vector<int>& prompt_lengths, const step_list& steps,
                            double allowed, const std::string& label) {
  const weight_store weights = make_dummy_weights(config, weight_type, weight_seed, test_init());
  compare_steps_with_cpu(config, weights, options, prompt_lengths, steps, allowed, label);
}

// Prefill two prompts (one in two chunks), then decode a few steps in a batch, comparing every
// step's logits with the CPU backend fed the same batches.
void compare_with_cpu(architecture arch, dtype weight_type, dtype activation, double allowed) {
  cuda_options options;
  options.activation = activation;
  step_list steps{{{0, 1}, {17, 11}}, {{0}, {12}}};
  for (int i = 0; i < 6; ++i) steps.push_back({{0, 1}, {1, 1}});
  compare_steps_with_cpu(tiny_config(arch), 17, weight_type, options, {29, 11}, steps, allowed,
                         std::string(dtype_name(activation)));
}

TEST(cuda_model, random_models_match_the_cpu_backend_in_f32) {
  TROUPE_REQUIRE_GPU();
  for (architecture arch : {architecture::llama, architecture::mistral, architecture::qwen2, architecture::qwen3}) {
    compare_with_cpu(arch, dtype::f32, dtype::f32, 1e-4);
  }
}

TEST(cuda_model, random_bf16_models_match_the_cpu_backend_within_bf16_tolerance) {
  TROUPE_REQUIRE_GPU();
  for (architecture arch : {architecture::llama, architecture::qwen2, architecture::qwen3}) {
    compare_with_cpu(arch, dtype::bf16, dtype::bf16, 3e-2);
    compare_with_cpu(arch, dtype::bf16, dtype::f16, 1e-2);
  }
}

// A q8_0 or fp8 KV pool on the GPU against the CPU backend's pool of the same dtype (f32
// activations on both). The two sides' K and V differ in their last f32 bits, which now and then
// round to a neighbouring q8_0 / fp8 step: the bound is that of such flips, set without a GPU at
// hand (to be tightened once measured; the f32 pool's bound is 1e-4).
TEST(cuda_model, quantized_kv_pools_match_the_cpu_backend_with_the_same_kv_dtype) {
  TROUPE_REQUIRE_GPU();
  for (dtype kv : {dtype::q8_0, dtype::fp8_e4m3}) {
    cuda_options options;
    options.activation = dtype::f32;
    options.kv_cache = kv;
    step_list steps{{{0, 1}, {17, 11}}, {{0}, {12}}};
    for (int i = 0; i < 6; ++i) steps.push_back({{0, 1}, {1, 1}});
    for (architecture arch : {architecture::llama, architecture::qwen3}) {
      compare_steps_with_cpu(tiny_config(arch), 19, dtype::f32, options, {29, 11}, steps, 2e-2,
                             std::string("KV ") + std::string(dtype_name(kv)));
    }
  }
}

// Nano-batches: a step cut between sequences into pieces on separate streams must compute what
// one stream does. The minimum piece is tiny so that these small batches are cut (into up to 2
// or 3 pieces); prefill, mixed chunk + decode steps and decode-only steps (graphs, never cut).
TEST(cuda_model, nano_batches_on_separate_streams_match_the_cpu_backend) {
  TROUPE_REQUIRE_GPU();
  step_list steps{
      {{0, 1, 2, 3}, {20, 11, 9, 6}},  // two prompts whole, two chunked
      {{1, 3, 0, 2}, {1, 1, 9, 8}},    // decodes beside the last chunks
  };
  for (int i = 0; i < 3; ++i) steps.push_back({{0, 1, 2, 3}, {1, 1, 1, 1}});
  for (int pieces : {2, 3}) {
    cuda_options options;
    options.activation = dtype::f32;
    options.nano_batches = pieces;
    options.min_nano_batch_rows = 4;
    for (architecture arch : {architecture::llama, architecture::qwen2, architecture::qwen3}) {
      compare_steps_with_cpu(tiny_config(arch), 29, dtype::f32, options, {29, 11, 17, 6}, steps, 1e-4,
                             std::to_string(pieces) + " nano-batches");
    }
  }
}

TEST(cuda_model, refuses_nano_batches_outside_one_to_four) {
  TROUPE_REQUIRE_GPU();
  const model_config config = tiny_config(architecture::llama);
  const weight_store weights = make_dummy_weights(config, dtype::f32, 1);
  cuda_options options;
  options.nano_batches = 5;
  EXPECT_THROW(make_cuda_model(config, weights, kv_cache_shape{4, 8}, options), std::runtime_error);
}

TEST(cuda_model, rejects_bad_batches_with_a_clear_error) {
  TROUPE_REQUIRE_GPU();
  const model_config config = tiny_config(architecture::llama);
  const weight_store weights = make_dummy_weights(config, dtype::f32, 1);
  auto gpu = make_cuda_model(config, weights, kv_cache_shape{4, 8}, cuda_options{});
  batch_driver driver(8, 4, 1);
  driver.add({5, 6, 7});
  forward_batch batch = driver.step({0}, {3});
  batch.block_tables[0] = 99;
  std::vector<float> logits(config.vocab_size);
  EXPECT_THROW(gpu->forward(batch, logits.data()), std::runtime_error);
}

TEST(cuda_model, sizes_the_kv_pool_from_free_memory) {
  TROUPE_REQUIRE_GPU();
  const model_config config = tiny_config(architecture::qwen2);
  const weight_store weights = make_dummy_weights(config, dtype::bf16, 1);
  cuda_options options;
  options.gpu_memory_utilization = 0.05f;
  auto gpu = make_cuda_model(config, weights, kv_cache_shape{0, 16}, options);
  size_t free_bytes = 0, total_bytes = 0;
  cuda::check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const double pool =
      2.0 * config.num_layers * gpu->kv_shape().num_blocks * 16 * config.num_kv_heads * config.head_dim * 2;
  EXPECT_GT(gpu->kv_shape().num_blocks, 0);
  EXPECT_LE(pool, 0.05 * total_bytes);
  EXPECT_NE(gpu->backend_name().find("cuda"), std::string::npos);
}

// ---- quantized weights ----

// `base`'s tensors with each matrix (embedding, projections, lm_head) replaced by random blocks
// (tests/backends/cuda/random_quant_blocks.hpp) of type_for(name), where that type's blocks fit
// its rows; plain where type_for gives a plain type. Both backends then read the same bytes.
weight_store with_quantized_matrices(std::shared_ptr<const weight_store> base,
                                     const std::function<dtype(const std::string&)>& type_for, uint32_t seed) {
  weight_store store;
  store.keep_alive(base);
  uint32_t n = 0;
  for (const auto& [name, tensor] : base->tensors()) {
    const dtype type = type_for(name);
    if (tensor.shape.size() != 2 || !is_quantized(type) || tensor.cols() % dtype_block_size(type) != 0) {
      store.add(tensor);
      continue;
    }
    auto bytes = std::make_shared<std::vector<std::byte>>(
        cuda::testing::random_quantized_rows(type, tensor.rows(), tensor.cols(), seed + n++, 0.15f));
    store.keep_alive(bytes);
    weight_tensor quantized;
    quantized.name = name;
    quantized.type = type;
    quantized.shape = tensor.shape;
    quantized.data = bytes->data();
    quantized.num_bytes = bytes->size();
    store.add(std::move(quantized));
  }
  return store;
}

// A Llama-family shape whose rows are whole 256-value blocks.
model_config quantizable_config(architecture arch) {
  model_config c = tiny_config(arch);
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 512;
  return c;
}

// Prefill (28 tokens: the dequantize-and-cuBLASLt path), a 12-token chunk, then decode steps of
// two sequences (the GEMV, replayed from CUDA graphs).
void compare_quantized_with_cpu(const model_config& config, const weight_store& weights, dtype activation,
                                double allowed, const std::string& label) {
  cuda_options options;
  options.activation = activation;
  step_list steps{{{0, 1}, {17, 11}}, {{0}, {12}}};
  for (int i = 0; i < 6; ++i) steps.push_back({{0, 1}, {1, 1}});
  compare_steps_with_cpu(config, weights, options, {29, 11}, steps, allowed, label);
}

TEST(cuda_quantized_model, every_weight_type_matches_the_cpu_backend) {
  TROUPE_REQUIRE_GPU();
  const std::vector<architecture> archs{architecture::llama, architecture::qwen2, architecture::qwen3};
  int i = 0;
  for (dtype type : cuda::testing::quantized_weight_types()) {
    // Untied (llama) and tied (qwen2, qwen3: the output layer reads the quantized embedding table).
    const model_config config = quantizable_config(archs[i++ % archs.size()]);
    auto base = std::make_shared<weight_store>(make_dummy_weights(config, dtype::f32, 41, test_init()));
    const weight_store weights = with_quantized_matrices(
        base, [&](const std::string&) { return type; }, 7);
    // Both backends multiply the exact decoded weights in f32.
    compare_quantized_with_cpu(config, weights, dtype::f32, 1e-4, std::string(dtype_name(type)) + " in f32");
  }
}

// What a Q4_K_M file holds: q4_k projections, q6_k for v, down and the output layer, a q8_0
// embedding table, f32 norms; in 16-bit activations.
TEST(cuda_quantized_model, a_q4_k_m_like_mix_matches_the_cpu_backend_in_16_bit_activations) {
  TROUPE_REQUIRE_GPU();
  const auto q4_k_m = [](const std::string& name) {
    if (name.find("v_proj") != std::string::npos || name.find("down_proj") != std::string::npos ||
        name.find("lm_head") != std::string::npos) {
      return dtype::q6_k;
    }
    return name.find("embed_tokens") != std::string::npos ? dtype::q8_0 : dtype::q4_k;
  };
  for (architecture arch : {architecture::llama, architecture::qwen2}) {
    const model_config config = quantizable_config(arch);
    auto base = std::make_shared<weight_store>(make_dummy_weights(config, dtype::f32, 43, test_init()));
    const weight_store weights = with_quantized_matrices(base, q4_k_m, 11);
    compare_quantized_with_cpu(config, weights, dtype::bf16, 3e-2, "q4_k_m-like in bf16");
    compare_quantized_with_cpu(config, weights, dtype::f16, 1e-2, "q4_k_m-like in f16");
  }
}

// FP8 checkpoints' matrices stay FP8 on the GPU: E4M3 with a scale per row (as make_dummy_weights
// writes them, the way per-channel FP8 checkpoints store them), and fp8_e4m3_b128 (block-wise
// scaled checkpoints as the loader rewrites them). Untied (llama) and tied (qwen2: the output
// layer reads the FP8 embedding table and its row scales).
TEST(cuda_quantized_model, fp8_models_with_row_and_block_scales_match_the_cpu_backend) {
  TROUPE_REQUIRE_GPU();
  for (architecture arch : {architecture::llama, architecture::qwen2}) {
    const model_config config = quantizable_config(arch);
    const weight_store weights = make_dummy_weights(config, dtype::fp8_e4m3, 49, test_init());
    compare_quantized_with_cpu(config, weights, dtype::f32, 1e-4, "fp8 in f32");
    compare_quantized_with_cpu(config, weights, dtype::bf16, 3e-2, "fp8 in bf16");
    auto base = std::make_shared<weight_store>(make_dummy_weights(config, dtype::f32, 51, test_init()));
    const weight_store blocks = with_quantized_matrices(
        base, [](const std::string&) { return dtype::fp8_e4m3_b128; }, 11);
    compare_quantized_with_cpu(config, blocks, dtype::f32, 1e-4, "fp8_e4m3_b128 in f32");
  }
}

TEST(cuda_quantized_model, nano_batches_with_quantized_weights_match_the_cpu_backend) {
  TROUPE_REQUIRE_GPU();
  const model_config config = quantizable_config(architecture::llama);
  auto base = std::make_shared<weight_store>(make_dummy_weights(config, dtype::f32, 45, test_init()));
  const weight_store weights = with_quantized_matrices(
      base, [](const std::string&) { return dtype::q4_0; }, 13);
  step_list steps{{{0, 1, 2, 3}, {20, 11, 9, 6}}, {{1, 3, 0, 2}, {1, 1, 9, 8}}};
  for (int i = 0; i < 3; ++i) steps.push_back({{0, 1, 2, 3}, {1, 1, 1, 1}});
  cuda_options options;
  options.activation = dtype::f32;
  options.nano_batches = 2;
  options.min_nano_batch_rows = 4;
  compare_steps_with_cpu(config, weights, options, {29, 11, 17, 6}, steps, 1e-4, "q4_0, 2 nano-batches");
}

// The trained model with every matrix whose rows fit 32-value blocks in Q8_0 (written by
// Troupe's own quantizer; down_proj's rows of 172 stay f32): the GPU's logits are the CPU's.
TEST(cuda_quantized_model, stories260k_in_q8_0_matches_the_cpu_backend) {
  TROUPE_REQUIRE_GPU();
  const loaded_model loaded = load_model(load_options{shared_dir() + "/models/stories260K/hf"});
  weight_store weights;
  for (const auto& [name, tensor] : loaded.weights.tensors()) {
    if (tensor.shape.size() != 2 || tensor.cols() % 32 != 0 || tensor.type != dtype::f32) {
      weights.add(tensor);
      continue;
    }
    auto bytes = std::make_shared<std::vector<std::byte>>(row_bytes(dtype::q8_0, tensor.num_elements()));
    quant::quantize_row(dtype::q8_0, reinterpret_cast<const float*>(tensor.data), tensor.num_elements(), bytes->data());
    weights.keep_alive(bytes);
    weight_tensor quantized;
    quantized.name = name;
    quantized.type = dtype::q8_0;
    quantized.shape = tensor.shape;
    quantized.data = bytes->data();
    quantized.num_bytes = bytes->size();
    weights.add(std::move(quantized));
  }
  cuda_options options;
  options.activation = dtype::f32;
  step_list steps{{{0, 1}, {20, 7}}};
  for (int i = 0; i < 8; ++i) steps.push_back({{0, 1}, {1, 1}});
  compare_steps_with_cpu(loaded.config, weights, options, {20, 7}, steps, 1e-4, "stories260K q8_0");
}

// Device memory: a Q4_0 model takes its quantized bytes, not its F16 size. The weights' size is
// what the model reports (backend_name), and what cudaMemGetInfo sees against the same model
// with F16 weights, less the Q4_0 model's dequantization scratch.
TEST(cuda_quantized_model, weights_stay_quantized_in_device_memory) {
  TROUPE_REQUIRE_GPU();
  model_config config = quantizable_config(architecture::llama);
  config.hidden_size = 1024;
  config.intermediate_size = 2816;
  config.num_layers = 4;
  config.num_heads = 16;
  config.num_kv_heads = 8;
  config.head_dim = 64;
  config.vocab_size = 8192;
  auto base = std::make_shared<weight_store>(make_dummy_weights(config, dtype::f32, 47, test_init()));
  const weight_store q4 = with_quantized_matrices(
      base, [](const std::string&) { return dtype::q4_0; }, 17);
  const weight_store f16 = make_dummy_weights(config, dtype::f16, 47, test_init());
  size_t matrices_f16 = 0, matrices_q4 = 0, vectors = 0;
  for (const auto& [name, tensor] : q4.tensors()) {
    if (tensor.shape.size() == 2) {
      matrices_q4 += tensor.num_bytes;
      matrices_f16 += static_cast<size_t>(tensor.num_elements()) * 2;
    } else {
      vectors += static_cast<size_t>(tensor.num_elements()) * 2;
    }
  }
  cuda_options options;
  options.activation = dtype::f16;
  auto used_by = [&](const weight_store& weights, std::string* name) {
    size_t free_before = 0, free_after = 0, total = 0;
    cuda::check(cudaMemGetInfo(&free_before, &total), "cudaMemGetInfo");
    auto gpu = make_cuda_model(config, weights, kv_cache_shape{64, 16}, options);
    cuda::check(cudaMemGetInfo(&free_after, &total), "cudaMemGetInfo");
    *name = gpu->backend_name();
    return static_cast<double>(free_before) - static_cast<double>(free_after);
  };
  std::string name_q4, name_f16;
  used_by(q4, &name_q4);  // first: the context's lazily loaded modules and handles are not weights
  const double used_q4 = used_by(q4, &name_q4), used_f16 = used_by(f16, &name_f16);
  // Reported: the tensors' bytes (parts start 256-aligned: a few hundred bytes more at most).
  const double reported_q4 = std::stod(name_q4.substr(name_q4.find("weights ") + 8)) * (1 << 20);
  EXPECT_NEAR(reported_q4, static_cast<double>(matrices_q4 + vectors), 0.06 * (1 << 20) + 4096.0 * 20) << name_q4;
  const double reported_f16 = std::stod(name_f16.substr(name_f16.find("weights ") + 8)) * (1 << 20);
  EXPECT_NEAR(reported_f16, static_cast<double>(matrices_f16 + vectors), 0.06 * (1 << 20) + 4096.0 * 20) << name_f16;
  // Measured: the Q4_0 model saves the weights' difference, less its scratch (one slice of the
  // widest layer; the 8192-row output layer's 2048 rows... see cuda::dequantize_scratch_bytes),
  // within what cudaMalloc's 2 MiB rounding of ~20 allocations can move.
  const double scratch = 8192.0 * 1024 * 2;  // [min(8192 rows, 64 MiB / 2 KiB = 32768 rows), 1024] f16
  const double expected_saving = static_cast<double>(matrices_f16) - static_cast<double>(matrices_q4) - scratch;
  EXPECT_GT(used_f16 - used_q4, expected_saving - 48.0 * (1 << 20))
      << "q4_0 model took " << used_q4 / (1 << 20) << " MiB, f16 model " << used_f16 / (1 << 20) << " MiB";
  EXPECT_LT(used_f16 - used_q4, expected_saving + 48.0 * (1 << 20));
}

}  // namespace
}  // namespace troupe
