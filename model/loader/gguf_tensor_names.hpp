#pragma once
// llama.cpp's GGUF tensor names ("blk.3.attn_q.weight") and their canonical HF names
// ("model.layers.3.self_attn.q_proj.weight").

#include <optional>
#include <string>

namespace troupe {

// nullopt for a GGUF tensor with no HF counterpart (rope_freqs.weight, ...).
std::optional<std::string> hf_name_from_gguf(const std::string& gguf_name);
// Throws std::runtime_error for an HF name llama.cpp has no name for.
std::string gguf_name_from_hf(const std::string& hf_name);

}  // namespace troupe
