#include "model/loader/gguf_tensor_names.hpp"

#include <cstdlib>
#include <stdexcept>
#include <utility>

namespace troupe {
namespace {

// Per-layer parts: GGUF name part, HF name part (without ".weight"/".bias").
constexpr std::pair<const char*, const char*> layer_parts[] = {
    {"attn_norm", "input_layernorm"},
    {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"},
    {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"},
    {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},
    {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},
};

constexpr std::pair<const char*, const char*> global_names[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// Splits "<prefix><N>.<rest>" into N and rest.
bool split_layer(const std::string& name, const std::string& prefix, std::string& layer, std::string& rest) {
  if (name.rfind(prefix, 0) != 0) return false;
  size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return false;
  layer = name.substr(prefix.size(), dot - prefix.size());
  for (char c : layer) {
    if (c < '0' || c > '9') return false;
  }
  rest = name.substr(dot + 1);
  return true;
}

// Splits "part.weight" / "part.bias".
bool split_suffix(const std::string& rest, std::string& part, std::string& suffix) {
  size_t dot = rest.rfind('.');
  if (dot == std::string::npos) return false;
  part = rest.substr(0, dot);
  suffix = rest.substr(dot);
  return suffix == ".weight" || suffix == ".bias";
}

}  // namespace

std::optional<std::string> hf_name_from_gguf(const std::string& gguf_name) {
  for (const auto& [gguf, hf] : global_names) {
    if (gguf_name == gguf) return std::string(hf);
  }
  std::string layer, rest, part, suffix;
  if (!split_layer(gguf_name, "blk.", layer, rest) || !split_suffix(rest, part, suffix)) return std::nullopt;
  for (const auto& [gguf, hf] : layer_parts) {
    if (part == gguf) return "model.layers." + layer + "." + hf + suffix;
  }
  return std::nullopt;
}

std::string gguf_name_from_hf(const std::string& hf_name) {
  for (const auto& [gguf, hf] : global_names) {
    if (hf_name == hf) return gguf;
  }
  std::string layer, rest, part, suffix;
  if (split_layer(hf_name, "model.layers.", layer, rest) && split_suffix(rest, part, suffix)) {
    for (const auto& [gguf, hf] : layer_parts) {
      if (part == hf) return "blk." + layer + "." + gguf + suffix;
    }
  }
  throw std::runtime_error("tensor '" + hf_name + "' has no GGUF name");
}

}  // namespace troupe
