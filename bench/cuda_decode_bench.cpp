// Decode-step micro-benchmark of a Llama-3-8B-shaped model with random weights, against the
// floor set by reading every weight once at the measured copy bandwidth, and the time of a
// 1024-token prefill. Weights in bf16 or in GGUF block types, kept quantized on the device:
//
//   build/bench/troupe_bench_cuda_decode [bf16|q8_0|q4_0|q4_k|q6_k|q4_k_m ...]   (default: bf16)
//
// q4_k_m is a Q4_K_M-like mix: q4_k projections, q6_k for v_proj, down_proj and the output layer.
// Needs a GPU (about 17 GB of its memory for bf16, and a minute per type).

#include <bit>
#include <chrono>
#include <map>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "tests/backends/cuda/cuda_test_util.hpp"
#include "tests/backends/cuda/random_quant_blocks.hpp"

namespace troupe {
namespace {

using namespace troupe::cuda::testing;

model_config llama3_8b() {
  model_config c;
  c.arch = architecture::llama;
  c.architecture_name = "LlamaForCausalLM";
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.vocab_size = 128256;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.rope_scaling = llama3_rope_scaling(8.0f, 1.0f, 4.0f, 8192);
  return c;
}

// Random bf16 values in [-0.03, 0.03), filled by several threads (an 8B model is 16 GB).
std::shared_ptr<std::vector<uint16_t>> random_bf16(size_t n, uint64_t seed) {
  auto values = std::make_shared<std::vector<uint16_t>>(n);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      uint64_t state = seed * 0x9e3779b97f4a7c15ull + t + 1;
      for (size_t i = n * t / threads; i < n * (t + 1) / threads; ++i) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        const float u = static_cast<float>(state >> 40) / 16777216.0f;
        (*values)[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>((u - 0.5f) * 0.06f) >> 16);
      }
    });
  }
  for (auto& th : pool) th.join();
  return values;
}

// The type of each matrix for a type name of the command line (q4_k_m: the mix above).
dtype matrix_type(const std::string& spec, const std::string& name) {
  if (spec == "q4_k_m") {
    const bool wide = name.find("v_proj") != std::string::npos || name.find("down_proj") != std::string::npos ||
                      name.find("lm_head") != std::string::npos;
    return wide ? dtype::q6_k : dtype::q4_k;
  }
  const std::optional<dtype> type = dtype_from_name(spec);
  if (!type || (*type != dtype::bf16 && !is_quantized(*type))) throw std::runtime_error("bench: unknown type " + spec);
  return *type;
}

// Every layer views the same host tensors: uploading 32 layers needs one layer's host memory.
weight_store shared_layer_weights(const model_config& c, const std::string& spec, size_t* weight_bytes) {
  weight_store store;
  std::map<std::pair<std::vector<int64_t>, dtype>, std::shared_ptr<std::vector<std::byte>>> by_shape;
  *weight_bytes = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool count) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const dtype type = shape.size() == 1 ? dtype::bf16 : matrix_type(spec, name);
    auto& bytes = by_shape[{shape, type}];
    if (!bytes) {
      if (shape.size() == 1) {  // norms: 1.0
        const std::vector<uint16_t> ones(n, uint16_t{0x3f80});
        bytes = std::make_shared<std::vector<std::byte>>(n * 2);
        std::memcpy(bytes->data(), ones.data(), n * 2);
      } else if (type == dtype::bf16) {
        const auto values = random_bf16(n, by_shape.size());
        bytes = std::make_shared<std::vector<std::byte>>(n * 2);
        std::memcpy(bytes->data(), values->data(), n * 2);
      } else {
        bytes = std::make_shared<std::vector<std::byte>>(cuda::testing::random_quantized_rows(
            type, shape[0], shape[1], static_cast<uint32_t>(by_shape.size()), 0.03f));
      }
      store.keep_alive(bytes);
    }
    weight_tensor tensor;
    tensor.name = name;
    tensor.type = type;
    tensor.shape = shape;
    tensor.data = bytes->data();
    tensor.num_bytes = bytes->size();
    store.add(std::move(tensor));
    if (count) *weight_bytes += bytes->size();
  };
  const int64_t h = c.hidden_size, q = int64_t{c.num_heads} * c.head_dim, kv = int64_t{c.num_kv_heads} * c.head_dim,
                i = c.intermediate_size;
  add("model.embed_tokens.weight", {c.vocab_size, h}, false);  // a decode step reads one row
  add("lm_head.weight", {c.vocab_size, h}, true);
  add("model.norm.weight", {h}, true);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "self_attn.q_proj.weight", {q, h}, true);
    add(p + "self_attn.k_proj.weight", {kv, h}, true);
    add(p + "self_attn.v_proj.weight", {kv, h}, true);
    add(p + "self_attn.o_proj.weight", {h, q}, true);
    add(p + "mlp.gate_proj.weight", {i, h}, true);
    add(p + "mlp.up_proj.weight", {i, h}, true);
    add(p + "mlp.down_proj.weight", {h, i}, true);
    add(p + "input_layernorm.weight", {h}, true);
    add(p + "post_attention_layernorm.weight", {h}, true);
  }
  return store;
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written.
double copy_bandwidth() {
  const size_t bytes = size_t{2} << 30;
  cuda::device_buffer a(bytes), b(bytes);
  cuda::check(cudaMemset(a.get(), 1, bytes), "memset");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice);
  std::vector<float> times;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(start);
    cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * bytes / (times[times.size() / 2] * 1e-3);
}

// Median wall time of a prefill of `tokens` tokens of one sequence (logits of the last only).
double prefill_ms(model& m, int tokens, int reps) {
  const int block_size = m.kv_shape().block_size;
  forward_batch b;
  b.query_start = {0, tokens};
  b.context_lengths = {tokens};
  b.logits_rows = {tokens - 1};
  b.block_table_start = {0, (tokens + block_size - 1) / block_size};
  for (int k = 0; k < b.block_table_start[1]; ++k) b.block_tables.push_back(k);
  for (int t = 0; t < tokens; ++t) {
    b.token_ids.push_back(100 + t % 1000);
    b.positions.push_back(t);
    b.slot_mapping.push_back(t);
  }
  std::vector<float> logits(m.config().vocab_size);
  std::vector<double> times;
  for (int rep = 0; rep < reps + 2; ++rep) {
    const auto begin = std::chrono::steady_clock::now();
    m.forward(b, logits.data());
    const auto end = std::chrono::steady_clock::now();
    if (rep >= 2) times.push_back(std::chrono::duration<double, std::milli>(end - begin).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Median wall time of one decode step of `batch` sequences at context ~`context`.
double decode_step_ms(model& m, int batch, int context, int steps) {
  const int block_size = m.kv_shape().block_size;
  const int blocks_per_seq = (context + steps + 16 + block_size - 1) / block_size;
  if (blocks_per_seq * batch > m.kv_shape().num_blocks) throw std::runtime_error("bench: KV pool too small");
  forward_batch b;
  b.query_start.push_back(0);
  b.block_table_start.push_back(0);
  for (int s = 0; s < batch; ++s) {
    for (int k = 0; k < blocks_per_seq; ++k) b.block_tables.push_back(s * blocks_per_seq + k);
    b.block_table_start.push_back(static_cast<int32_t>(b.block_tables.size()));
    b.query_start.push_back(s + 1);
    b.logits_rows.push_back(s);
    b.token_ids.push_back(100 + s);
    b.positions.push_back(0);
    b.slot_mapping.push_back(0);
    b.context_lengths.push_back(0);
  }
  std::vector<float> logits(static_cast<size_t>(batch) * m.config().vocab_size);
  std::vector<double> times;
  for (int step = 0; step < steps + 3; ++step) {
    const int position = context + step;
    for (int s = 0; s < batch; ++s) {
      b.positions[s] = position;
      b.context_lengths[s] = position + 1;
      b.slot_mapping[s] = int64_t{s * blocks_per_seq + position / block_size} * block_size + position % block_size;
    }
    const auto begin = std::chrono::steady_clock::now();
    m.forward(b, logits.data());
    const auto end = std::chrono::steady_clock::now();
    if (step >= 3) times.push_back(std::chrono::duration<double, std::milli>(end - begin).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int run(const std::vector<std::string>& specs) {
  std::string why;
  if (!cuda_device_available(&why)) {
    std::fprintf(stderr, "troupe_bench_cuda_decode needs a GPU: %s\n", why.c_str());
    return 1;
  }
  const model_config config = llama3_8b();
  const double bandwidth = copy_bandwidth();
  cudaDeviceProp properties{};
  cudaGetDeviceProperties(&properties, 0);
  std::printf("device: %s; copy bandwidth (read+write) %.0f GB/s\n", properties.name, bandwidth / 1e9);
  std::printf("%-8s %-8s %-6s %-8s %10s %14s %18s\n", "weights", "graphs", "batch", "context", "step ms",
              "weights GB/s", "floor ms (copy bw)");
  for (const std::string& spec : specs) {
    size_t weight_bytes = 0;
    const weight_store weights = shared_layer_weights(config, spec, &weight_bytes);
    std::printf("%s: weight bytes per decode step %.2f GB\n", spec.c_str(), weight_bytes / 1e9);
    for (bool graphs : {true, false}) {
      cuda_options options;
      options.activation = dtype::bf16;
      options.cuda_graphs = graphs;
      auto m = make_cuda_model(config, weights, kv_cache_shape{4096, 16}, options);
      for (int batch : graphs ? std::vector<int>{1, 8, 32} : std::vector<int>{1}) {
        const double ms = decode_step_ms(*m, batch, 512, 20);
        // Floor: every weight byte crosses DRAM once, at the rate a copy moves bytes (read + write).
        std::printf("%-8s %-8s %-6d %-8d %10.3f %14.0f %18.3f\n", spec.c_str(), graphs ? "on" : "off", batch, 512, ms,
                    weight_bytes / (ms * 1e-3) / 1e9, weight_bytes / bandwidth * 1e3);
      }
      if (graphs) std::printf("%-8s prefill of 1024 tokens: %.2f ms\n", spec.c_str(), prefill_ms(*m, 1024, 5));
    }
  }
  return 0;
}

}  // namespace
}  // namespace troupe

int main(int argc, char** argv) {
  std::vector<std::string> specs(argv + 1, argv + argc);
  if (specs.empty()) specs.push_back("bf16");
  try {
    return troupe::run(specs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe_bench_cuda_decode: %s\n", e.what());
    return 1;
  }
}
