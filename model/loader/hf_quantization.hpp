#pragma once
// The quantization a Hugging Face checkpoint declares, read and validated: config.json's
// `quantization_config` (or `compression_config`, as older llm-compressor exports name it), else
// `quantize_config.json` (older AutoGPTQ exports) or `quant_config.json` (older AutoAWQ ones)
// beside it. The tensors themselves are unpacked by quantized_checkpoint.hpp.
//
// Loaded: quant_method fp8 (E4M3 weights with per-tensor, per-channel or block scales),
// compressed-tensors (float-quantized FP8; pack-quantized int4 W4A16), awq (AutoAWQ GEMM, 4-bit)
// and gptq (AutoGPTQ / GPTQModel, 4-bit, with or without desc_act). Anything else is refused by
// name, naming the field that says so.

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/weight_store.hpp"

namespace troupe {

// A quantized layer's weight as an unpacker makes it, with the buffer that holds its bytes (null
// when they are the checkpoint's own, in a mapping the store keeps alive anyway).
struct unpacked_weight {
  weight_tensor tensor;
  std::shared_ptr<const void> storage;
};

// How a checkpoint's quantized layers are stored.
enum class hf_quant_layout {
  fp8,          // `weight` E4M3 [out, in] + `weight_scale` (per tensor, per output channel or per
                //   block; `weight_scale_inv` in block-wise fp8 exports), optional `input_scale`
  awq,          // AutoAWQ GEMM: `qweight` int32 [in, out/8] (AWQ's interleaved nibble order),
                //   `qzeros` int32 [in/g, out/8], `scales` [in/g, out]
  gptq,         // AutoGPTQ / GPTQModel: `qweight` int32 [in/8, out], `qzeros` int32 [groups, out/8]
                //   (v1: zero - 1), `scales` [groups, out], `g_idx` int32 [in]
  packed_int4,  // compressed-tensors pack-quantized: `weight_packed` int32 [out, in/8] (value + 8),
                //   `weight_scale` [out, groups], `weight_zero_point` int32 [out/8, groups] when
                //   asymmetric, `weight_shape` [2], `weight_g_idx` [in] with actorder "group"
};

struct hf_quantization {
  hf_quant_layout layout = hf_quant_layout::fp8;
  std::string method;  // quant_method as written ("fp8", "compressed-tensors", "awq", "gptq")
  std::string source;  // where it was read, for messages: "config.json quantization_config"

  // int4 layouts (awq, gptq, packed_int4)
  int64_t group_size = 0;        // input columns per scale; 0: one group for a whole row
  bool act_order = false;        // each input column's group comes from g_idx (desc_act)
  bool zeros_minus_one = false;  // gptq checkpoint_format "gptq" (v1): qzeros store zero - 1
  bool symmetric = true;         // as declared; the loader decides by the zeros themselves

  // fp8
  std::optional<std::array<int64_t, 2>> weight_block;  // [rows, cols] sharing one scale
  bool static_input_scales = false;                    // activation_scheme "static": the CPU ignores input_scale
                                                       // (activations stay f32 there)
};

// nullopt when the checkpoint declares no quantization. Throws std::runtime_error naming the
// file and field for an unsupported or invalid one.
std::optional<hf_quantization> read_hf_quantization(const std::filesystem::path& directory);

// One quantization_config object; `source` prefixes every message ("config.json quantization_config").
hf_quantization parse_hf_quantization(const nlohmann::json& config, const std::string& source);

// A line for the load log: "gptq: int4, group 128, act-order (from config.json quantization_config)".
std::string describe(const hf_quantization& quantization);

}  // namespace troupe
