#pragma once
// A linear layer's weight in GPU memory: [out_features, in_features], row-major as stored, made
// of parts (runs of consecutive output rows), each of one type. A type the kernels decode (every
// GGUF block type, FP8 E4M3 and its b128 blocks) stays as it is in the file, quantized weights
// never widened in memory, a checkpoint's per-row scales beside it (row_scales); every other type,
// and a tensor with act-order columns (weight_tensor::input_order), is converted to the
// activation dtype on upload, its values made by weight_rows_f32. Fused layers (q|k|v, gate|up) are the parts of one
// weight, so they run as one product even where a file gives them different types (Q4_K_M keeps v_proj and some down
// projections in q6_k); consecutive parts of one type merge into one.

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/device_buffer.hpp"
#include "model/dtype.hpp"
#include "model/weight_store.hpp"

namespace troupe::cuda {

struct linear_part {
  dtype type = dtype::f32;  // a block type (quantized), or the activation dtype
  int first_row = 0;        // of the weight's out_features
  int rows = 0;
  size_t offset = 0;  // bytes into the storage; 256-aligned, as cudaMalloc aligns
};

struct linear_weight {
  int out_features = 0, in_features = 0;
  std::vector<linear_part> parts;
  // Shared: a tied lm_head is the embedding table's own storage.
  std::shared_ptr<device_buffer> storage;
  // [out_features] f32: each row's scale (1 for rows without), or null when no row has one.
  std::shared_ptr<device_buffer> row_scales;

  explicit operator bool() const { return storage != nullptr; }
  const std::byte* data(const linear_part& part) const { return storage->as<std::byte>() + part.offset; }
  size_t bytes() const { return storage ? storage->size() : 0; }
  // True when some part is in a block type (the weight is not one plain matrix).
  bool quantized() const;
  // The row scales from row `row` on, or null.
  const float* row_scales_from(int row) const;
};

// True for the types the CUDA kernels read as stored (quant_blocks.cuh).
bool kept_quantized(dtype type);
// True when `tensor` is uploaded as stored: a kept type, columns in their logical order, rows of
// whole decoder blocks (an FP8 row of a width not a multiple of 32 is converted).
bool stored_quantized(const weight_tensor& tensor);

// Copies (or converts) `tensor` into `destination` (device) in dtype `to`: f32, f16 and bf16
// on the device, any other type decoded on the host first. `staging` is device memory the call
// may grow. Synchronous.
void upload_converted(const weight_tensor& tensor, dtype to, void* destination, device_buffer& staging,
                      cudaStream_t stream);

// The weight made of `tensors` (each [rows_i, in_features], in order), in one allocation. Block
// types are copied as stored; others converted to `activation`. Throws std::runtime_error naming
// the tensor when its rows are not whole blocks or its byte count disagrees with its shape.
linear_weight upload_linear_weight(const std::vector<const weight_tensor*>& tensors, dtype activation,
                                   device_buffer& staging, cudaStream_t stream);

}  // namespace troupe::cuda
