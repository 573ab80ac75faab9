#pragma once
// The paged KV cache of one CUDA model, in device memory: per layer a K pool then a V pool, each
// [num_blocks, block_size, num_kv_heads, head_dim] of the KV element type (model/kv_transfer.hpp,
// the CPU backend's layout too, so a span moves between the two as it is). Export and import run
// on a stream of the pool's own, never on the compute streams: an export between layers must not
// queue behind the layers still computing, and an import from the KV receiver's thread (into
// blocks no step uses) must not wait for a forward in flight. Every forward synchronizes its
// streams before it returns, so a copy outside one sees its writes.

#include <cstddef>
#include <cstdint>
#include <span>

#include <cuda_runtime.h>

#include "backends/cuda/device_buffer.hpp"
#include "model/dtype.hpp"
#include "model/kv_transfer.hpp"
#include "model/model.hpp"
#include "model/model_config.hpp"

namespace troupe::cuda {

class kv_pool {
 public:
  // Allocates on the current device. shape.num_blocks == 0: as many blocks as the free memory
  // holds past the (1 - memory_utilization) share of the device kept back, at most max_blocks
  // (0: no cap). Throws std::runtime_error when not one block fits.
  kv_pool(const model_config& config, kv_cache_shape shape, dtype element, double memory_utilization,
          int64_t max_blocks);
  ~kv_pool();
  kv_pool(const kv_pool&) = delete;
  kv_pool& operator=(const kv_pool&) = delete;

  kv_cache_shape shape() const { return shape_; }
  dtype element() const { return element_; }
  void* keys(int layer) const { return data_.as<char>() + (2 * layer) * layer_bytes(); }
  void* values(int layer) const { return data_.as<char>() + (2 * layer + 1) * layer_bytes(); }
  device_kv_pool on_device(int device) const;

  // Copies blocks between the pool and a host span (layout in model/kv_transfer.hpp), converting
  // on the host when the span's element type differs. The caller has run check_kv_transfer.
  void export_blocks(std::span<const int32_t> block_ids, const kv_span_header& header, std::span<std::byte> out) const;
  void import_blocks(std::span<const int32_t> block_ids, const kv_span_header& header, std::span<const std::byte> data);

 private:
  size_t block_bytes() const;  // one block of one side of one layer
  size_t layer_bytes() const { return static_cast<size_t>(shape_.num_blocks) * block_bytes(); }

  model_config config_;
  kv_cache_shape shape_;
  dtype element_;
  device_buffer data_;
  cudaStream_t copy_stream_ = nullptr;
};

}  // namespace troupe::cuda
