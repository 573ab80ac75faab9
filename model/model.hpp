#pragma once
// A model ready to run on one backend: owns its (device-side) weights view and its paged KV pool.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "model/dtype.hpp"
#include "model/forward_batch.hpp"
#include "model/kv_transfer.hpp"
#include "model/model_config.hpp"

namespace troupe {

struct kv_cache_shape {
  int num_blocks = 0;
  int block_size = 16;
};

// How one row of logits is turned into a token by a backend that samples where the logits are
// (plain requests only: no penalties, min_p or logprobs, which the host sampler applies).
struct device_sampling_row {
  float temperature = 0.0f;  // 0: greedy (argmax, first index on ties)
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;         // the draw is uniform(seed, offset), as the host sampler's seeded draw
  uint64_t offset = 0;
  // Structured output: bit t of word t / 64 set = token t allowed (grammar_matcher::allowed_bits);
  // tokens past the last word are refused. Empty: no mask. A refused token counts as logit -inf,
  // so the choice is the host sampler's on the masked row. Must stay valid until forward_sample
  // returns. A mask that allows nothing samples -1 (the caller reports it, naming the request).
  std::span<const uint64_t> allowed_bits;
};

// Where a KV pool in GPU memory lives, for transports that copy device to device (CUDA IPC,
// NCCL; kvtransfer/). Same layout as the CPU pool and export_kv's runs: per layer, K then V,
// each [num_blocks, block_size, num_kv_heads, head_dim] of `element`, layers back to back.
struct device_kv_pool {
  int device = 0;
  void* base = nullptr;
  int num_layers = 0;
  int num_blocks = 0;
  size_t block_bytes = 0;  // one block of one side of one layer
  dtype element = dtype::f32;
};

class model {
 public:
  virtual ~model() = default;

  virtual const model_config& config() const = 0;
  virtual kv_cache_shape kv_shape() const = 0;
  virtual std::string backend_name() const = 0;

  // Runs the batch, writes its K/V into the pool, and fills `logits` [num_logits, vocab_size].
  virtual void forward(const forward_batch& batch, float* logits) = 0;

  // True when forward_sample works: the logits then never leave the device.
  virtual bool can_sample_on_device() const { return false; }
  // Runs the batch like forward, then samples logits row i with rows[i] into tokens[i]
  // (rows.size() == batch.num_logits()).
  virtual void forward_sample(const forward_batch& batch, std::span<const device_sampling_row> rows, int32_t* tokens) {
    throw std::runtime_error("model: backend " + backend_name() + " cannot sample on its device");
  }

  // KV export and import (model/kv_transfer.hpp has the span's byte layout). Each checks
  // everything (check_kv_transfer) before it touches the pool and throws std::invalid_argument
  // naming what is wrong; a refused call writes nothing.
  //
  // The element type of this model's KV pool: an export in it is a plain copy.
  virtual dtype kv_dtype() const {
    throw std::runtime_error("model: backend " + backend_name() + " cannot export or import KV");
  }
  // Writes layers [first_layer, first_layer + num_layers) of blocks `block_ids` into `out`, as
  // kv_span_for(config(), kv_shape(), block_ids.size(), first_layer, num_layers, element)
  // describes; out.size() must equal that span's kv_span_bytes.
  virtual void export_kv(std::span<const int32_t> block_ids, int first_layer, int num_layers, dtype element,
                         std::span<std::byte> out) const {
    throw std::runtime_error("model: backend " + backend_name() + " cannot export KV");
  }
  // The pool's place on its GPU; nullopt for a pool in host memory.
  virtual std::optional<device_kv_pool> kv_pool_on_device() const { return std::nullopt; }
  // Writes the span `data` described by `header` into blocks `block_ids` (which may differ from
  // the exporter's), converting to kv_dtype(). The caller owns the blocks; nothing else is touched.
  virtual void import_kv(std::span<const int32_t> block_ids, const kv_span_header& header,
                         std::span<const std::byte> data) {
    throw std::runtime_error("model: backend " + backend_name() + " cannot import KV");
  }
};

}  // namespace troupe
