// CPU attention alone (backends/cpu/paged_attention.*), one layer of a model's shape, at
// growing contexts: what a decode token's and a prompt chunk's attention cost, apart from the
// matrix products around them.
//
//   troupe_bench_attention [--heads 16] [--kv-heads 4] [--head-dim 64] [--threads 2]
//                          [--contexts 128,1024,4096,16384,32768] [--chunk 512]
//                          [--kv-cache-dtype f16] [--reps 5] [--layers 1]
//
// Per context C: decode, one token attending to C keys (µs per call, KV bytes read per second,
// ns per context token); prefill, the last --chunk tokens of a C-token prompt (their causal
// share of C keys; GFLOP/s counting 4 · head_dim flops per (query head, visible key)). Each
// figure is the best of --reps calls by wall clock, and, with --threads 1, the same call's CPU
// time (on a loaded machine the wall clock says what the others left us; the CPU time what the
// kernel cost). The KV pool holds random values; blocks are handed out shuffled, as a server's are.
// With --layers L the pool holds L layers and each call attends over all of them one after
// another, as a decode step does (figures per layer): a model's KV at a long context is past the
// L3, where one layer's may fit in it.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/backend_selection.hpp"
#include "backends/cpu/kv_pool.hpp"
#include "backends/cpu/paged_attention.hpp"
#include "backends/cpu/simd_level.hpp"
#include "backends/cpu/thread_pool.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) values.push_back(std::stoi(item));
  return values;
}

struct timing {
  double wall = 1e300;  // best call, seconds
  double cpu = 0;       // that call's process CPU time
};

template <class Fn>
timing best_of(int reps, Fn&& fn) {
  fn();  // warm caches and page tables
  timing best;
  for (int r = 0; r < reps; ++r) {
    const double cpu_start = cpu_seconds();
    const auto start = clock_type::now();
    fn();
    const double wall = std::chrono::duration<double>(clock_type::now() - start).count();
    if (wall < best.wall) best = {wall, cpu_seconds() - cpu_start};
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) try {
  int heads = 16, kv_heads = 4, head_dim = 64, threads = 2, chunk = 512, reps = 5, layers = 1;
  std::string contexts_arg = "128,1024,4096,16384,32768", kv_dtype_arg = "f16";
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::runtime_error("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--heads")
      heads = std::stoi(value);
    else if (flag == "--kv-heads")
      kv_heads = std::stoi(value);
    else if (flag == "--head-dim")
      head_dim = std::stoi(value);
    else if (flag == "--threads")
      threads = std::stoi(value);
    else if (flag == "--contexts")
      contexts_arg = value;
    else if (flag == "--chunk")
      chunk = std::stoi(value);
    else if (flag == "--kv-cache-dtype")
      kv_dtype_arg = value;
    else if (flag == "--reps")
      reps = std::stoi(value);
    else if (flag == "--layers")
      layers = std::stoi(value);
    else
      throw std::runtime_error("unknown flag " + flag);
  }
  const troupe::dtype kv_dtype = troupe::parse_kv_cache_dtype(kv_dtype_arg).value_or(troupe::dtype::f16);
  const std::vector<int> contexts = parse_list(contexts_arg);
  const int max_context = *std::max_element(contexts.begin(), contexts.end());
  const int block_size = 16;
  const int num_blocks = (max_context + block_size - 1) / block_size;

  troupe::model_config config;
  if (layers < 1) throw std::runtime_error("--layers needs at least 1");
  config.num_layers = layers;
  config.num_heads = heads;
  config.num_kv_heads = kv_heads;
  config.head_dim = head_dim;
  troupe::cpu::kv_pool kv(config, {num_blocks, block_size}, kv_dtype);
  const int kv_dim = kv_heads * head_dim, q_dim = heads * head_dim;
  std::vector<int32_t> blocks(num_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::mt19937 rng(1);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> rows(static_cast<size_t>(1024) * kv_dim);
    std::vector<int64_t> slots(1024);
    for (int t0 = 0; t0 < max_context; t0 += 1024) {
      const int n = std::min(1024, max_context - t0);
      for (float& v : rows) v = normal(rng);
      for (int t = 0; t < n; ++t)
        slots[t] = int64_t{blocks[(t0 + t) / block_size]} * block_size + (t0 + t) % block_size;
      for (int layer = 0; layer < layers; ++layer) kv.write(layer, rows.data(), rows.data(), kv_dim, slots.data(), n);
    }
  }
  troupe::cpu::thread_pool pool(threads);
  const troupe::cpu::attention_params params{
      heads, kv_heads, head_dim, block_size, num_blocks, 1.0f / std::sqrt(static_cast<float>(head_dim)), kv_dtype};
  troupe::cpu::attention_workspace workspace;
  std::vector<float> q(static_cast<size_t>(chunk) * q_dim, 0.1f), out(q.size());
  {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : q) v = normal(rng);
  }
  auto batch_for = [&](int context, int num_new) {
    troupe::forward_batch batch;
    batch.token_ids.assign(num_new, 0);
    batch.query_start = {0, num_new};
    batch.context_lengths = {context};
    batch.block_table_start = {0, (context + block_size - 1) / block_size};
    batch.block_tables.assign(blocks.begin(), blocks.begin() + batch.block_table_start[1]);
    return batch;
  };

  // One call: the attention of every layer, one after another.
  auto attend = [&](const troupe::forward_batch& batch) {
    for (int layer = 0; layer < layers; ++layer) {
      troupe::cpu::paged_attention(pool, q.data(), q_dim, kv.keys(layer), kv.values(layer), batch, params, out.data(),
                                   q_dim, workspace);
    }
  };

  std::printf("attention: %d heads / %d kv heads, head_dim %d, KV %s, %s, %d threads, %d layers; best of %d\n", heads,
              kv_heads, head_dim, troupe::dtype_name(kv_dtype).data(),
              troupe::cpu::simd_level_name(troupe::cpu::active_simd_level()).data(), threads, layers, reps);
  std::printf(
      "| context | decode µs | KV GB/s | ns / context token | decode CPU µs | prefill %d tokens ms | GFLOP/s | prefill "
      "CPU ms |\n",
      chunk);
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const int context : contexts) {
    const troupe::forward_batch decode = batch_for(context, 1);
    troupe::cpu::check_attention_batch(decode, params);
    timing d = best_of(reps, [&] { attend(decode); });
    const double kv_bytes = 2.0 * context * static_cast<double>(troupe::kv_bytes(kv_dtype, kv_dim));
    const int num_new = std::min(chunk, context);
    const troupe::forward_batch prefill = batch_for(context, num_new);
    timing p = best_of(std::max(1, reps / 2), [&] { attend(prefill); });
    for (timing* t : {&d, &p}) *t = {t->wall / layers, t->cpu / layers};  // per layer
    double visible = 0;  // (query, key) pairs the chunk's causal mask lets through
    for (int i = 0; i < num_new; ++i) visible += context - num_new + i + 1;
    const double flops = 4.0 * head_dim * heads * visible;
    std::printf("| %d | %.1f | %.1f | %.2f | %.1f | %.2f | %.1f | %.2f |\n", context, d.wall * 1e6,
                kv_bytes / d.wall / 1e9, d.wall * 1e9 / context, d.cpu * 1e6, p.wall * 1e3, flops / p.wall / 1e9,
                p.cpu * 1e3);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "troupe_bench_attention: %s\n", e.what());
  return 1;
}
