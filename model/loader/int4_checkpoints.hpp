#pragma once
// Readers of the 4-bit layouts the quantization tools write, each into an int4_layer
// (int4_blocks.hpp). Bit orders, as the tools pack them:
//   AWQ (AutoAWQ GEMM, awq/modules/linear/gemm.py WQLinear_GEMM.from_linear): qweight [in, out/8]
//     packs output columns 8·c .. 8·c+7 of input row i into word c, nibble k holding column
//     8·c + [0, 2, 4, 6, 1, 3, 5, 7][k]; qzeros [in/g, out/8] alike; scales [in/g, out].
//   GPTQ (AutoGPTQ; GPTQModel's pack_block): qweight [in/8, out] packs input rows 8·w .. 8·w+7
//     of output column o into word (w, o), nibble k holding row 8·w + k; qzeros [groups, out/8]
//     packs output columns in order, nibble k holding column 8·c + k; scales [groups, out];
//     g_idx [in]. Format v1 ("gptq") stores zero - 1 by subtracting 0x11111111 from each 32-bit
//     word (GPTQModel's convert_gptq_v2_to_v1_format: a borrow crosses nibbles where a zero is
//     0), so the word is read back by adding it; v2 ("gptq_v2") stores the zeros.
//   compressed-tensors pack-quantized (pack_to_int32): weight_packed [out, in/8] packs input
//     columns in order, nibble k of word (o, c) holding column 8·c + k, as value + 8;
//     weight_zero_point [out/8, groups] packs output rows in order (packed_dim 0), value + 8, and
//     is absent when symmetric (zero 0, i.e. 8 once offset); weight_scale [out, groups];
//     weight_g_idx [in] with actorder "group"; weight_shape [2] = (out, in).

#include <string>

#include "model/loader/hf_quantization.hpp"
#include "model/loader/int4_blocks.hpp"
#include "model/loader/safetensors_file.hpp"

namespace troupe {

// Each reads linear layer `prefix` ("model.layers.0.mlp.up_proj") into an int4_layer named
// prefix + ".weight". Throws std::runtime_error naming the tensor and what was expected (missing
// tensor, wrong dtype or shape, a g_idx out of range, desc_act without g_idx).
int4_layer read_awq_layer(const safetensors_checkpoint& checkpoint, const std::string& prefix,
                          const hf_quantization& q);
int4_layer read_gptq_layer(const safetensors_checkpoint& checkpoint, const std::string& prefix,
                           const hf_quantization& q);
int4_layer read_packed_int4_layer(const safetensors_checkpoint& checkpoint, const std::string& prefix,
                                  const hf_quantization& q);

}  // namespace troupe
