// Single-stream speed of the CPU backend on a dummy model of a real small shape (12 layers,
// hidden 768, 12 heads, intermediate 3072, vocab 32000 by default): prompt tokens/s for one
// prompt of --prompt tokens in one forward, and decode tokens/s for --decode tokens after it,
// one token per forward. Weights are random (or read from --model, e.g. the model maker's HF
// directory, so llama.cpp can run the very same weights from its GGUF).
//
//   troupe_bench_cpu [--dtype f32|f16|bf16|q8_0|fp8_e4m3] [--threads N] [--prompt 512] [--decode 64]
//                    [--reps 3] [--model HF_DIR]
//   troupe_bench_cpu --make OUT_DIR --tokenizer TOKENIZER [--dtype f32|f16]
//       writes the benchmark shape with the model maker (HF + model.gguf, same weights) so
//       bench/llama_cpp_bench.mjs can time llama.cpp on it; needs a 32000-token tokenizer.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/cpu_model.hpp"
#include "backends/cpu/simd_level.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "model/loader/dummy_weights.hpp"
#include "model/loader/model_loader.hpp"
#include "model/model_maker.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

troupe::dtype parse_dtype(const std::string& name) {
  for (auto type : {troupe::dtype::f32, troupe::dtype::f16, troupe::dtype::bf16, troupe::dtype::q8_0, troupe::dtype::fp8_e4m3})
    if (troupe::dtype_name(type) == name) return type;
  throw std::runtime_error("unknown --dtype '" + name + "' (expected f32, f16, bf16, q8_0 or fp8_e4m3)");
}

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) try {
  std::string dtype_arg = "f32", model_path, make_dir, tokenizer;
  int threads = 0, prompt = 512, decode = 64, reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::runtime_error("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--dtype") dtype_arg = value;
    else if (flag == "--threads") threads = std::stoi(value);
    else if (flag == "--prompt") prompt = std::stoi(value);
    else if (flag == "--decode") decode = std::stoi(value);
    else if (flag == "--reps") reps = std::stoi(value);
    else if (flag == "--model") model_path = value;
    else if (flag == "--make") make_dir = value;
    else if (flag == "--tokenizer") tokenizer = value;
    else throw std::runtime_error("unknown flag " + flag);
  }
  if (threads <= 0) threads = troupe::cpu::hardware_threads();
  if (!make_dir.empty()) {
    troupe::model_maker_options options;
    options.arch = "llama";
    options.hidden_size = 768;
    options.intermediate_size = 3072;
    options.num_layers = 12;
    options.num_heads = 12;
    options.num_kv_heads = 12;
    options.type = parse_dtype(dtype_arg);
    options.tokenizer = tokenizer;
    options.out = make_dir;
    const troupe::made_model made = troupe::make_model(options);
    std::printf("wrote %s and %s (vocab %d)\n", made.hf_dir.c_str(), made.gguf_path.c_str(), made.config.vocab_size);
    return 0;
  }

  troupe::model_config config;
  troupe::weight_store weights;
  if (!model_path.empty()) {
    troupe::loaded_model loaded = troupe::load_model(troupe::load_options{model_path});
    config = loaded.config;
    weights = std::move(loaded.weights);
  } else {
    config.arch = troupe::architecture::llama;
    config.hidden_size = 768;
    config.intermediate_size = 3072;
    config.num_layers = 12;
    config.num_heads = 12;
    config.num_kv_heads = 12;
    config.head_dim = 64;
    config.vocab_size = 32000;
    config.max_position_embeddings = 2048;
    weights = troupe::make_dummy_weights(config, parse_dtype(dtype_arg), 1);
  }

  const int block_size = 16;
  const int num_blocks = (prompt + decode + block_size - 1) / block_size;
  auto model = troupe::make_cpu_model(config, weights, {num_blocks, block_size}, threads);
  std::vector<int32_t> blocks(num_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::vector<float> logits(config.vocab_size);

  auto batch_for = [&](int first, int count, int32_t token) {
    troupe::forward_batch batch;
    for (int t = first; t < first + count; ++t) {
      batch.token_ids.push_back(token + t % 97);
      batch.positions.push_back(t);
      batch.slot_mapping.push_back(t);
    }
    batch.query_start = {0, count};
    batch.context_lengths = {first + count};
    batch.block_table_start = {0, num_blocks};
    batch.block_tables = blocks;
    batch.logits_rows = {count - 1};
    return batch;
  };

  std::printf("model: %d layers, hidden %d, heads %d/%d, intermediate %d, vocab %d, %s weights (%.1f MiB)\n",
              config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
              config.intermediate_size, config.vocab_size, model_path.empty() ? dtype_arg.c_str() : model_path.c_str(),
              weights.total_bytes() / 1048576.0);
  std::printf("backend: %s\n", model->backend_name().c_str());

  double best_prompt = 0, best_decode = 0;
  for (int rep = 0; rep < reps + 1; ++rep) {  // the first round warms caches and page tables
    const troupe::forward_batch prompt_batch = batch_for(0, prompt, 5);
    auto start = clock_type::now();
    model->forward(prompt_batch, logits.data());
    const double prompt_s = seconds_since(start);
    start = clock_type::now();
    for (int i = 0; i < decode; ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      model->forward(batch_for(prompt + i, 1, next), logits.data());
    }
    const double decode_s = seconds_since(start);
    if (rep == 0) continue;
    best_prompt = std::max(best_prompt, prompt / prompt_s);
    best_decode = std::max(best_decode, decode / decode_s);
    std::printf("rep %d: prompt %d tokens %.3f s (%.1f tok/s), decode %d tokens %.3f s (%.2f tok/s)\n", rep,
                prompt, prompt_s, prompt / prompt_s, decode, decode_s, decode / decode_s);
  }
  std::printf("best: prompt %.1f tok/s, decode %.2f tok/s (threads %d)\n", best_prompt, best_decode, threads);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "troupe_bench_cpu: %s\n", e.what());
  return 1;
}
