#pragma once
// Which backend a model runs on (`--device cpu|cuda|auto`, `[node] device`) and building it.
// The CUDA backend is optional: this file is the one place that knows whether it was compiled
// (TROUPE_HAVE_CUDA, defined by the troupe_cuda library) and whether a GPU answers; everything
// else asks here. Without CUDA the caller falls back to the CPU and is told why, in one line.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "model/dtype.hpp"
#include "model/layer_range.hpp"
#include "model/model.hpp"
#include "model/model_config.hpp"
#include "model/weight_store.hpp"

namespace troupe {

enum class device_kind { cpu, cuda };

// What a user asked for: a device, or `auto` (CUDA when a GPU answers, else the CPU).
enum class device_request { cpu, cuda, auto_detect };

// "cpu", "cuda", "auto"; throws std::runtime_error naming the bad value.
device_request parse_device_request(std::string_view name);
std::string_view device_request_name(device_request request);

// The CUDA backend's activation dtype: "f32", "f16", "bf16"; throws naming the bad value.
dtype parse_activation_dtype(std::string_view name);

// The KV cache's element type (`--kv-cache-dtype`, `kv_cache_dtype`): "auto" (nullopt), "f32",
// "f16", "bf16", "q8_0" or "fp8_e4m3"; throws std::runtime_error naming the bad value.
std::optional<dtype> parse_kv_cache_dtype(std::string_view name);

struct device_choice {
  device_kind kind = device_kind::cpu;
  // Non-empty when the request could not be honoured as asked (the fallback's reason), for a log line.
  std::string fallback_reason;
};

// True when this build carries the CUDA backend.
bool cuda_backend_compiled();

// Explicit cuda without a usable GPU (or without CUDA compiled) is an error (std::runtime_error
// saying why): a server asked for a GPU must not quietly serve on the CPU. auto falls back to the
// CPU with a note.
device_choice choose_device(device_request requested);

struct backend_options {
  int threads = 0;                      // CPU compute threads; 0: every hardware thread
  float gpu_memory_utilization = 0.9f;  // CUDA: share of the GPU's memory model + KV pool may take
  dtype cuda_dtype = dtype::bf16;       // CUDA activations: f32 | f16 | bf16
  int nano_batches = 1;                 // CUDA: streams a kernel-by-kernel step is spread over (1 to 4)
  // The KV cache's element type, as parse_kv_cache_dtype reads it. "auto": on the CPU f16 for a
  // model whose layers' products are batch-invariant (quantized weights), else f32 (see
  // resolve_kv_cache_dtype); cuda_dtype on CUDA.
  std::string kv_cache_dtype = "auto";
  // A pipeline stage's layers (model/layer_range.hpp); the default is the whole model. The CPU
  // backend builds stages; CUDA refuses a stage by name for now.
  layer_range layers;

  // Throws std::runtime_error naming the first bad field.
  void validate() const;
};

// The KV cache dtype `options` asks for on `device` for a model of `weights` ("auto" resolved).
dtype resolve_kv_cache_dtype(const backend_options& options, device_kind device, const weight_store& weights);

// The KV pool: `num_blocks` blocks of `block_size` tokens, or when num_blocks is 0, as many as
// fit: in `cpu_budget_bytes` on the CPU, under gpu_memory_utilization of free memory on CUDA.
struct kv_pool_request {
  int num_blocks = 0;
  int block_size = 16;
  size_t cpu_budget_bytes = 512u << 20;
  int max_useful_blocks = 0;  // sized from memory: never more than this (0: no cap)
};

// Builds the model on `device`. Throws std::runtime_error naming what is wrong (a bad dtype, a
// budget that holds no block, a model the backend cannot run).
std::unique_ptr<model> make_backend_model(const model_config& config, const weight_store& weights, device_kind device,
                                          const kv_pool_request& kv, const backend_options& options);

}  // namespace troupe
