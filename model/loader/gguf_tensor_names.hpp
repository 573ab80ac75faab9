#pragma once
// llama.cpp's GGUF tensors ("blk.3.attn_q.weight", "blk.3.ffn_gate_exps.weight") and the
// canonical tensors they hold (model/model_tensors.hpp). Most are one to one; a few GGUF
// tensors stack several canonical ones along their outermost dimension (every expert of a
// layer in one [experts, rows, cols] tensor; Phi-3's fused qkv and gate+up), and some are stored
// transformed (q/k rows interleaved for arch "llama"; Gemma's norms as 1 + w). One plan,
// gguf_tensor_layouts(), serves the loader (GGUF -> canonical) and the model maker (the reverse).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model_config.hpp"

namespace troupe {

struct gguf_tensor_layout {
  std::string gguf_name;
  // The canonical tensors it holds, stacked along the outermost dimension in this order; each
  // part is one slice of the whole (every part has the same size unless `part_rows` says).
  std::vector<std::string> parts;
  std::vector<int64_t> part_rows;  // rows of each part when they differ (Phi-3's qkv); else empty
  std::vector<int64_t> shape;      // the whole tensor, outermost first (as canonical shapes are)
  bool gguf_1d = false;            // stored 1-D although the canonical part is [1, n] (Qwen2-MoE's shared expert gate)
  int permuted_heads = 0;          // > 0: rows interleaved for RoPE per head (arch "llama" q/k)
  bool norm_plus_one = false;      // stored as 1 + w (Gemma's (1 + w) norms)
};

// Every GGUF tensor a model of `config` has, in a stable order (the canonical order of
// expected_tensors, a stacked tensor where its first part falls).
std::vector<gguf_tensor_layout> gguf_tensor_layouts(const model_config& config);

// One-to-one names of the Llama family (llama, qwen2, qwen3): nullopt for a GGUF tensor with no
// canonical counterpart (rope_freqs.weight, ...).
std::optional<std::string> hf_name_from_gguf(const std::string& gguf_name);
// Throws std::runtime_error for a canonical name llama.cpp has no one-to-one name for.
std::string gguf_name_from_hf(const std::string& hf_name);

}  // namespace troupe
