// Single-stream speed of the CPU backend on a dummy model of a real small shape (12 layers,
// hidden 768, 12 heads, intermediate 3072, vocab 32000 by default): prompt tokens/s for one
// prompt of --prompt tokens (forwards of --chunk tokens, as a server's chunked prefill; 0: one
// forward), and decode tokens/s for --decode tokens after it, one token per forward, so decode
// runs at a context of --prompt tokens. Weights are random (or read from --model, e.g. the model
// maker's HF directory, so llama.cpp can run the very same weights from its GGUF).
//
//   troupe_bench_cpu [--dtype f32|f16|bf16|q8_0|fp8_e4m3|any GGUF type] [--threads N] [--prompt 512]
//                    [--decode 64] [--reps 3] [--chunk 2048] [--kv-cache-dtype f16]
//                    [--model HF_DIR|FILE.gguf] [--bandwidth 1] [--warmup 1]
//       --bandwidth 1 also measures this machine's DRAM read rate (every thread streaming a
//       1 GiB buffer) and prints the decode step's roof: (weight bytes + KV bytes read) / rate.
//   troupe_bench_cpu --streams 1,8,32,64 [--context 64] [--decode 16] ...
//       batched decode instead: for each count, that many sequences of --context tokens (their
//       prefill not timed) decode --decode steps together, one token each per forward; prints
//       the step time and the aggregate tokens/s.
//   --integer-kernels off: quantized weights through f32 conversions (the path before the integer
//   kernels); --repack off: quantized weights read in their GGUF layout at every step, not
//   repacked at load (backends/cpu/quant_repack.hpp); --gemm-min-rows N: where float weights switch from row dots to
//   sgemm; --float-rows-at-every-count on: float weights take the cache-blocked row dots from
//   there on instead of sgemm (the server's --batch-invariant); --float-panels off: f16 and bf16
//   weights from there through f32 slabs + sgemm, not the panel kernels (backends/cpu/row_kernels.hpp);
//   --experts-side-by-side off: a mixture-of-experts layer's decode runs its experts one after
//   another across all threads, not each whole on one thread (backends/cpu/moe_layer.hpp).
//   --huge-pages off: weights that are not repacked read from the file's mapping (4 KiB pages), not
//   copied into huge pages at load (backends/cpu/huge_page_weights.hpp).
//   troupe_bench_cpu --make OUT_DIR --tokenizer TOKENIZER [--dtype f32|f16]
//       writes the benchmark shape with the model maker (HF + model.gguf, same weights) so
//       bench/llama_cpp_bench.mjs can time llama.cpp on it; needs a 32000-token tokenizer.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/blas_core.hpp"
#include "backends/backend_selection.hpp"
#include "backends/cpu/cpu_model.hpp"
#include "backends/cpu/huge_page_weights.hpp"
#include "backends/cpu/matmul.hpp"
#include "backends/cpu/moe_layer.hpp"
#include "backends/cpu/quant_repack.hpp"
#include "backends/cpu/simd_level.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "bench/bench_support.hpp"
#include "model/loader/dummy_weights.hpp"
#include "model/loader/model_loader.hpp"
#include "model/model_maker.hpp"
#include "model/model_tensors.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

troupe::dtype parse_dtype(const std::string& name) {
  if (auto type = troupe::dtype_from_name(name)) return *type;
  throw std::runtime_error("unknown --dtype '" + name +
                           "' (expected f32, f16, bf16, fp8_e4m3 or a GGUF type such as q4_k)");
}

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// The process's CPU seconds: on a shared machine a thread taken off its core stops this clock, so
// CPU time per thread says what the code costs when it runs (exact for one thread; with more, a
// pool thread's spin-wait counts too).
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Bytes/s at which `threads` threads read a buffer far larger than the caches (best of 5 passes).
double dram_read_rate(int threads) {
  const size_t words = (size_t{1} << 30) / sizeof(uint64_t);
  std::vector<uint64_t> buffer(words);
  troupe::cpu::thread_pool pool(threads);
  pool.parallel_for(0, static_cast<int64_t>(words), 1 << 16, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) buffer[i] = static_cast<uint64_t>(i) * 2654435761u;  // touch every page
  });
  std::vector<uint64_t> sums(threads * 8);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = clock_type::now();
    pool.parallel_for(0, static_cast<int64_t>(words), 1 << 16, [&](int64_t begin, int64_t end, int thread) {
      uint64_t a = 0, b = 0, c = 0, d = 0;  // four chains, so the adds never wait on each other
      int64_t i = begin;
      for (; i + 4 <= end; i += 4) {
        a += buffer[i];
        b += buffer[i + 1];
        c += buffer[i + 2];
        d += buffer[i + 3];
      }
      for (; i < end; ++i) a += buffer[i];
      sums[thread * 8] += a + b + c + d;
    });
    best = std::max(best, static_cast<double>(words * sizeof(uint64_t)) / seconds_since(start));
  }
  if (std::accumulate(sums.begin(), sums.end(), uint64_t{0}) == 42) std::printf(" ");  // keep the reads
  return best;
}

}  // namespace

int main(int argc, char** argv) try {
  troupe::cpu::restart_with_blas_settings(argv);  // backends/cpu/blas_core.hpp
  std::string dtype_arg = "f32", model_path, make_dir, tokenizer, streams_arg, kv_dtype_arg = "f16";
  int threads = 0, prompt = 512, decode = 64, reps = 3, context = 64, chunk = 2048, bandwidth = 0, warmup = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::runtime_error("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--dtype")
      dtype_arg = value;
    else if (flag == "--threads")
      threads = std::stoi(value);
    else if (flag == "--prompt")
      prompt = std::stoi(value);
    else if (flag == "--decode")
      decode = std::stoi(value);
    else if (flag == "--reps")
      reps = std::stoi(value);
    else if (flag == "--model")
      model_path = value;
    else if (flag == "--make")
      make_dir = value;
    else if (flag == "--tokenizer")
      tokenizer = value;
    else if (flag == "--streams")
      streams_arg = value;
    else if (flag == "--context")
      context = std::stoi(value);
    else if (flag == "--integer-kernels")
      troupe::cpu::set_matmul_integer_kernels(value != "off");
    else if (flag == "--repack")
      troupe::cpu::set_weight_repacking(value != "off");
    else if (flag == "--huge-pages")
      troupe::cpu::set_weights_in_huge_pages(value != "off");
    else if (flag == "--experts-side-by-side")
      troupe::cpu::moe_layer::set_experts_side_by_side(value != "off");
    else if (flag == "--gemm-min-rows")
      troupe::cpu::set_matmul_gemm_min_rows(std::stoi(value));
    else if (flag == "--float-rows-at-every-count")
      troupe::cpu::set_matmul_float_rows_at_every_count(value != "off");
    else if (flag == "--float-panels")
      troupe::cpu::set_matmul_float_panels(value != "off");
    else if (flag == "--chunk")
      chunk = std::stoi(value);
    else if (flag == "--kv-cache-dtype")
      kv_dtype_arg = value;
    else if (flag == "--bandwidth")
      bandwidth = std::stoi(value);
    else if (flag == "--warmup")
      warmup = std::stoi(value);
    else
      throw std::runtime_error("unknown flag " + flag);
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
  const auto load_start = clock_type::now();
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

  const std::optional<troupe::dtype> kv_choice = troupe::parse_kv_cache_dtype(kv_dtype_arg);
  const troupe::dtype kv_dtype = kv_choice.value_or(troupe::dtype::f16);
  const int block_size = 16;
  if (!streams_arg.empty()) {
    // Batched decode: N sequences, each with its own blocks, one token each per step.
    const std::vector<int> counts = troupe::bench::parse_list(streams_arg);
    const int max_streams = *std::max_element(counts.begin(), counts.end());
    const int per_seq = (context + decode + block_size - 1) / block_size;
    auto model = troupe::make_cpu_model(config, weights, {per_seq * max_streams, block_size}, threads, kv_dtype);
    weights.release_copies(troupe::cpu_weights_not_read(*model));
    std::printf("model: %d layers, hidden %d, intermediate %d, vocab %d, %.1f MiB of weights; backend %s\n",
                config.num_layers, config.hidden_size, config.intermediate_size, config.vocab_size,
                weights.total_bytes() / 1048576.0, model->backend_name().c_str());
    std::printf("%8s %12s %14s   (context %d, %d steps, best of %d, load average %.2f)\n", "streams", "step ms",
                "tokens/s", context, decode, reps, troupe::bench::load_average());
    for (int n : counts) {
      // Rows of sequence s: tokens [first, first + count) of its own, in blocks s * per_seq + ...
      auto step = [&](int first, int count) {
        troupe::forward_batch batch;
        batch.query_start.push_back(0);
        batch.block_table_start.push_back(0);
        for (int s = 0; s < n; ++s) {
          for (int t = first; t < first + count; ++t) {
            batch.token_ids.push_back((5 + (t * 31 + s * 7) % 997) % config.vocab_size);
            batch.positions.push_back(t);
            batch.slot_mapping.push_back(int64_t{s} * per_seq * block_size + t);
          }
          batch.query_start.push_back(batch.num_tokens());
          batch.context_lengths.push_back(first + count);
          for (int b = 0; b < per_seq; ++b) batch.block_tables.push_back(s * per_seq + b);
          batch.block_table_start.push_back(static_cast<int32_t>(batch.block_tables.size()));
          batch.logits_rows.push_back(batch.num_tokens() - 1);
        }
        return batch;
      };
      std::vector<float> step_logits(static_cast<size_t>(n) * config.vocab_size);
      double best = 1e30;
      for (int rep = 0; rep < reps + 1; ++rep) {
        model->forward(step(0, context), step_logits.data());  // the contexts (not timed)
        const auto start = clock_type::now();
        for (int i = 0; i < decode; ++i) model->forward(step(context + i, 1), step_logits.data());
        if (rep > 0) best = std::min(best, seconds_since(start));
      }
      std::printf("%8d %12.2f %14.1f\n", n, best / decode * 1e3, n * decode / best);
      std::fflush(stdout);
    }
    return 0;
  }
  const int num_blocks = (prompt + decode + block_size - 1) / block_size;
  const double read_s = seconds_since(load_start);
  const auto make_start = clock_type::now();
  auto model = troupe::make_cpu_model(config, weights, {num_blocks, block_size}, threads, kv_dtype);
  weights.release_copies(troupe::cpu_weights_not_read(*model));  // as a served model does (engine/served_model.cpp)
  const double make_s = seconds_since(make_start);
  if (chunk <= 0) chunk = prompt;
  std::vector<int32_t> blocks(num_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::vector<float> logits(config.vocab_size);

  auto batch_for = [&](int first, int count, int32_t token) {
    troupe::forward_batch batch;
    for (int t = first; t < first + count; ++t) {
      batch.token_ids.push_back((token + t % 97) % config.vocab_size);  // any id inside the vocabulary
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
              config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads, config.intermediate_size,
              config.vocab_size, model_path.empty() ? dtype_arg.c_str() : model_path.c_str(),
              weights.total_bytes() / 1048576.0);
  std::printf("backend: %s\n", model->backend_name().c_str());
  // Load: the file opened and its tensors viewed (mapped), then the model made from them (the
  // repack at load, which also touches every page of the mapped weights for the first time).
  std::printf(
      "load: %.2f s (open %.2f s, make model %.2f s; load average %.2f); after load VmRSS %.0f MB, VmHWM %.0f MB\n",
      read_s + make_s, read_s, make_s, troupe::bench::load_average(), troupe::bench::process_memory_mb("VmRSS"),
      troupe::bench::process_memory_mb("VmHWM"));

  double best_prompt = 0, best_decode = 0, best_prompt_cpu = 0, best_decode_cpu = 0;
  for (int rep = 1 - warmup; rep <= reps; ++rep) {  // round 0 warms caches and page tables
    auto start = clock_type::now();
    const double cpu_start = process_cpu_seconds();
    for (int first = 0; first < prompt; first += chunk) {
      model->forward(batch_for(first, std::min(chunk, prompt - first), 5), logits.data());
    }
    const double prompt_s = seconds_since(start);
    const double prompt_cpu_s = (process_cpu_seconds() - cpu_start) / threads;
    start = clock_type::now();
    const double decode_cpu_start = process_cpu_seconds();
    for (int i = 0; i < decode; ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      model->forward(batch_for(prompt + i, 1, next), logits.data());
    }
    const double decode_s = seconds_since(start);
    const double decode_cpu_s = (process_cpu_seconds() - decode_cpu_start) / threads;
    if (rep <= 0) continue;
    best_prompt = std::max(best_prompt, prompt / prompt_s);
    best_decode = std::max(best_decode, decode / decode_s);
    best_prompt_cpu = std::max(best_prompt_cpu, prompt / prompt_cpu_s);
    best_decode_cpu = std::max(best_decode_cpu, decode / decode_cpu_s);
    std::printf(
        "rep %d: prompt %d tokens %.3f s (%.1f tok/s), decode %d tokens %.3f s (%.2f tok/s); per CPU second of "
        "each thread: prompt %.1f tok/s, decode %.2f tok/s\n",
        rep, prompt, prompt_s, prompt / prompt_s, decode, decode_s, decode / decode_s, prompt / prompt_cpu_s,
        decode / decode_cpu_s);
  }
  std::printf(
      "best: prompt %.1f tok/s, decode %.2f tok/s (threads %d); CPU clock: prompt %.1f tok/s, decode %.2f tok/s\n",
      best_prompt, best_decode, threads, best_prompt_cpu, best_decode_cpu);
  if (bandwidth > 0 && best_decode > 0) {
    // A decode step reads every weight once (the embedding: one row; a tied lm_head is the
    // embedding, read whole; experts: only the routed ones) and every cached K and V byte of the
    // context once.
    size_t weight_bytes = weights.total_bytes();
    const troupe::model_tensor_names names = troupe::tensor_names(config);
    if (!config.tie_word_embeddings) weight_bytes -= weights.get(names.embed_tokens).num_bytes;
    // A mixture-of-experts layer reads only the experts its token is routed to: k of E of them.
    double routed_bytes = 0;
    for (const auto& layer : names.layers) {
      for (const auto& expert : layer.experts) {
        for (const std::string* name : {&expert.gate_proj, &expert.up_proj, &expert.down_proj, &expert.gate_bias,
                                        &expert.up_bias, &expert.down_bias}) {
          if (const troupe::weight_tensor* t = name->empty() ? nullptr : weights.find(*name))
            routed_bytes += t->num_bytes;
        }
      }
    }
    if (routed_bytes > 0) {
      const double active =
          weight_bytes - routed_bytes * (1.0 - double(config.moe.experts_per_token) / config.moe.num_experts);
      std::printf("experts: %.1f MB of %.1f MB of weights are routed experts; a token reads %d of %d: %.1f MB active\n",
                  routed_bytes / 1e6, weight_bytes / 1e6, config.moe.experts_per_token, config.moe.num_experts,
                  active / 1e6);
      weight_bytes = static_cast<size_t>(active);
    }
    const double context = prompt + decode / 2.0;  // the mean context of the decode steps
    const double kv_bytes =
        context * config.num_layers * 2.0 *
        static_cast<double>(troupe::kv_bytes(kv_dtype, size_t(config.num_kv_heads) * config.head_dim));
    const double rate = dram_read_rate(threads);
    const double roof_ms = (weight_bytes + kv_bytes) / rate * 1e3, step_ms = 1e3 / best_decode;
    std::printf(
        "roof: DRAM read %.1f GB/s (%d threads); decode step reads %.1f MB of weights + %.1f MB of KV "
        "(%s) = %.3f ms at the roof; measured %.3f ms: roof/measured %.2f\n",
        rate / 1e9, threads, weight_bytes / 1e6, kv_bytes / 1e6, troupe::dtype_name(kv_dtype).data(), roof_ms, step_ms,
        roof_ms / step_ms);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "troupe_bench_cpu: %s\n", e.what());
  return 1;
}
