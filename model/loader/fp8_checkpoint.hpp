#pragma once
// FP8 linear layers of quant_method fp8 and compressed-tensors float-quantized checkpoints:
// `weight` E4M3FN [out, in] and its scale, value = scale * e4m3(weight), the scale being
//   - one number (`weight_scale` [] or [1]: per tensor), or one per output row
//     (`weight_scale` [out] or [out, 1]: per channel): the weight stays as the file stores it
//     (fp8_e4m3, memory-mapped) and the scales ride in weight_tensor::row_scales, which the
//     backend applies to each output after the product;
//   - one per block of [rows, cols] (`weight_scale_inv` of fp8 exports with weight_block_size,
//     `weight_scale` of compressed-tensors strategy block or group): rows are rewritten as
//     fp8_e4m3_b128 blocks, each 128 columns carrying their block's scale (cols a multiple of 128).
// `input_scale` (static activation scales) is dropped: activations stay f32 on the CPU, as on
// GPUs without FP8 arithmetic, where engines run these checkpoints weight-only.

#include <string>

#include "model/loader/hf_quantization.hpp"
#include "model/loader/safetensors_file.hpp"
#include "model/weight_store.hpp"

namespace troupe {

// The weight of linear layer `prefix` ("model.layers.0.mlp.up_proj"), named prefix + ".weight".
// Throws std::runtime_error naming the tensor for a missing, misshapen or NaN / infinite scale, a
// NaN weight, or block scales whose columns do not fit blocks of 128.
unpacked_weight read_fp8_layer(const safetensors_checkpoint& checkpoint, const std::string& prefix,
                               const hf_quantization& q);

}  // namespace troupe
