#pragma once
// The Llama-family model (llama, mistral, qwen2 with qkv bias, qwen3 with q/k norm) on one CUDA
// GPU. Weights in a GGUF block type (q4_k, q8_0, ...) stay quantized in device memory and are
// read by quantized kernels (backends/cuda/linear.hpp); others are converted to the activation
// dtype on upload. Logits come back as f32.
// Decode steps (one new token per sequence) replay CUDA graphs captured once per batch-size
// bucket; other steps run kernel by kernel. Both go through model::forward.

#include <memory>
#include <optional>
#include <string>

#include "model/dtype.hpp"
#include "model/model.hpp"
#include "model/model_config.hpp"
#include "model/weight_store.hpp"

namespace troupe {

struct cuda_options {
  int device = 0;
  dtype activation = dtype::bf16;  // f32, f16 or bf16: weights and activations
  // The KV pool's element type (f32, f16, bf16, q8_0 with head_dim % 32 == 0, fp8_e4m3); none:
  // the activation dtype.
  std::optional<dtype> kv_cache;
  float gpu_memory_utilization = 0.9f;  // share of the GPU's memory the model may hold (KV sizing)
  bool cuda_graphs = true;              // replay captured graphs for decode steps
  int max_graph_batch = 256;            // decode batches above this run kernel by kernel
  // When the pool is sized from memory: no more blocks than this (0: no cap). A small model on a
  // big GPU would otherwise get millions of blocks that no scheduler limit lets it use.
  int max_kv_blocks = 0;
  // Steps run kernel by kernel (prefill and mixed batches, decode batches above max_graph_batch)
  // are cut into up to this many nano-batches of at least min_nano_batch_rows rows, each on a
  // stream of its own, so one's matrix products overlap another's attention (backends/cuda/nano_batches).
  int nano_batches = 1;
  int min_nano_batch_rows = 256;
  // Quantized linear layers: calls of up to this many tokens read the blocks in place (GEMV);
  // larger ones dequantize slices of at most dequantize_scratch_bytes (per stream) for cuBLASLt.
  int quantized_gemv_max_tokens = 8;
  size_t dequantize_scratch_bytes = size_t{64} << 20;
};

// True when a CUDA device answers; otherwise `why` (if given) says what the runtime reported.
bool cuda_device_available(std::string* why = nullptr);

// Uploads `weights` to options.device and allocates the paged KV pool. kv_shape.num_blocks == 0
// sizes the pool from the memory left under gpu_memory_utilization. Throws std::runtime_error
// for a missing or misshapen tensor, an unsupported config, or no device.
std::unique_ptr<model> make_cuda_model(const model_config& config, const weight_store& weights, kv_cache_shape kv_shape,
                                       const cuda_options& options = {});

}  // namespace troupe
