#pragma once
// A Hugging Face checkpoint's tensors turned into weights: plain ones as they are (viewing the
// mapped files), a quantized checkpoint's layers through the unpacker of its layout
// (fp8_checkpoint.hpp, int4_checkpoints.hpp + int4_blocks.hpp), its activation and KV-cache
// scales dropped (activations and the KV cache keep Troupe's own types).

#include <optional>

#include "model/loader/hf_quantization.hpp"
#include "model/loader/safetensors_file.hpp"
#include "model/weight_store.hpp"

namespace troupe {

// Adds the weights of `checkpoint` to `store` (which keeps the mappings alive). Without a
// quantization, a tensor only a quantized checkpoint has (qweight, weight_packed, weight_scale)
// is refused by name, as is a quantized layer's tensor whose companions are missing.
void add_hf_weights(const safetensors_checkpoint& checkpoint, const std::optional<hf_quantization>& quantization,
                    weight_store& store);

}  // namespace troupe
