#include "backends/cuda/kv_pool.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.hpp"

namespace troupe::cuda {

kv_pool::kv_pool(const model_config& config, kv_cache_shape shape, dtype element, double memory_utilization,
                 int64_t max_blocks)
    : config_(config), shape_(shape), element_(element) {
  if (shape_.num_blocks == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    const double reserved = (1.0 - memory_utilization) * static_cast<double>(total_bytes);
    const double budget = static_cast<double>(free_bytes) - reserved;
    const double per_block = 2.0 * config_.num_layers * static_cast<double>(block_bytes());
    const int64_t blocks = budget > 0 ? static_cast<int64_t>(budget / per_block) : 0;
    if (blocks < 1) {
      throw std::runtime_error("cuda model: no memory left for the KV pool under gpu_memory_utilization " +
                               std::to_string(memory_utilization) + " (" + std::to_string(free_bytes >> 20) +
                               " MiB free of " + std::to_string(total_bytes >> 20) + " MiB)");
    }
    const int64_t cap = max_blocks > 0 ? max_blocks : int64_t(1) << 30;
    shape_.num_blocks = static_cast<int>(std::min<int64_t>(blocks, cap));
  }
  data_.allocate(2 * config_.num_layers * layer_bytes());
  check(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}

kv_pool::~kv_pool() {
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
}

size_t kv_pool::block_bytes() const {
  return static_cast<size_t>(shape_.block_size) *
         kv_bytes(element_, static_cast<size_t>(config_.num_kv_heads) * config_.head_dim);
}

device_kv_pool kv_pool::on_device(int device) const {
  return device_kv_pool{device, data_.get(), config_.num_layers, shape_.num_blocks, block_bytes(), element_};
}

// Device-to-host per contiguous run (one block of one side of one layer), then the conversion
// on the host: simple and enough for a first step; a kernel can convert on the device later.
void kv_pool::export_blocks(std::span<const int32_t> block_ids, const kv_span_header& header,
                            std::span<std::byte> out) const {
  const size_t run_elements = kv_block_elements(header);
  const size_t run_bytes = kv_bytes(element_, run_elements);
  const size_t span_elements = run_elements * block_ids.size() * 2 * header.num_layers;
  std::vector<std::byte> staging;  // [span] in the pool's dtype, only when a conversion follows
  std::byte* target = out.data();
  if (header.element != element_) {
    staging.resize(kv_bytes(element_, span_elements));
    target = staging.data();
  }
  for (int layer = header.first_layer; layer < header.first_layer + header.num_layers; ++layer) {
    for (const void* side : {keys(layer), values(layer)}) {
      for (const int32_t block : block_ids) {
        check(cudaMemcpyAsync(target, static_cast<const char*>(side) + static_cast<size_t>(block) * run_bytes,
                              run_bytes, cudaMemcpyDeviceToHost, copy_stream_),
              "export KV block");
        target += run_bytes;
      }
    }
  }
  check(cudaStreamSynchronize(copy_stream_), "export KV");
  if (header.element != element_)
    convert_kv_elements(element_, staging.data(), header.element, out.data(), span_elements);
}

void kv_pool::import_blocks(std::span<const int32_t> block_ids, const kv_span_header& header,
                            std::span<const std::byte> data) {
  const size_t run_elements = kv_block_elements(header);
  const size_t run_bytes = kv_bytes(element_, run_elements);
  std::vector<std::byte> staging;  // [span] converted to the pool's dtype
  const std::byte* source = data.data();
  if (header.element != element_) {
    const size_t count = run_elements * block_ids.size() * 2 * header.num_layers;
    staging.resize(kv_bytes(element_, count));
    convert_kv_elements(header.element, data.data(), element_, staging.data(), count);
    source = staging.data();
  }
  for (int layer = header.first_layer; layer < header.first_layer + header.num_layers; ++layer) {
    for (void* side : {keys(layer), values(layer)}) {
      for (const int32_t block : block_ids) {
        check(cudaMemcpyAsync(static_cast<char*>(side) + static_cast<size_t>(block) * run_bytes, source, run_bytes,
                              cudaMemcpyHostToDevice, copy_stream_),
              "import KV block");
        source += run_bytes;
      }
    }
  }
  // The host buffers must outlive the copies, and the next forward must see the blocks.
  check(cudaStreamSynchronize(copy_stream_), "import KV");
}

}  // namespace troupe::cuda
