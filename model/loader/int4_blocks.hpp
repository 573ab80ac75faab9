#pragma once
// A 4-bit linear layer of an AWQ, GPTQ or compressed-tensors checkpoint, unpacked from its tool's
// layout (int4_checkpoints.hpp), and its repacking into GGUF's legacy 32-element blocks, so that
// the CPU backend's q4_0 / q4_1 kernels (and any backend that reads those types) serve it.
//
// Every tool stores value = scale[g] * (code - zero[g]) with 4-bit codes and zeros and one
// (scale, zero) per group g of input columns. A block of 32 columns of one row that share a group
// is exactly
//   q4_0 [d f16][16 bytes]          d = scale, when zero is 8 (symmetric GPTQ / compressed-tensors)
//   q4_1 [d f16][m f16][16 bytes]   d = scale, m = -zero * scale rounded to f16 (AWQ, asymmetric)
// the only loss being m's f16 rounding: |error| <= 2^-11 |zero * scale| (docs/benchmarks.md
// gives its measured effect on logits).
//
// Act-order (GPTQ desc_act, compressed-tensors actorder "group"): g_idx scatters a group's
// columns over the row. The columns are then sorted by group (stable), so each block of 32 has
// one group again, and the tensor records the order (weight_tensor::input_order): the backend
// gathers the activations in the same order before the product, as exllama and Marlin do.

#include <cstdint>
#include <string>
#include <vector>

#include "model/loader/hf_quantization.hpp"
#include "model/weight_store.hpp"

namespace troupe {

struct int4_layer {
  std::string name;            // the weight's name: "model.layers.0.mlp.up_proj.weight"
  int64_t rows = 0;            // out_features
  int64_t cols = 0;            // in_features
  std::vector<uint8_t> codes;  // [rows, cols], 0..15
  int64_t num_groups = 0;
  std::vector<uint8_t> zeros;  // [num_groups, rows], 0..15
  std::vector<float> scales;   // [num_groups, rows]
  std::vector<int32_t> group;  // [cols]: the group of each input column, < num_groups

  // scale * (code - zero) of element (row, col), in double: the reference the repacking is held to.
  double value(int64_t row, int64_t col) const;
};

// Repacks `layer` into q4_0 (when every zero is 8) or q4_1 blocks, reordering columns when 32
// consecutive ones do not share a group. Throws std::runtime_error naming the tensor for a NaN,
// infinite or f16-overflowing scale, or groups that cannot be cut into whole blocks of 32 columns
// (cols not a multiple of 32, or a group whose size is not).
unpacked_weight repack_int4(const int4_layer& layer);

}  // namespace troupe
