#include "model/quant/quantize_presets.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>

namespace troupe::quant {
namespace {

// llama.cpp's llama_ftype numbers of the presets offered here.
enum file_type : uint32_t {
  all_f32 = 0,
  mostly_f16 = 1,
  mostly_q4_0 = 2,
  mostly_q4_1 = 3,
  mostly_q8_0 = 7,
  mostly_q5_0 = 8,
  mostly_q5_1 = 9,
  mostly_q2_k = 10,
  mostly_q3_k_s = 11,
  mostly_q3_k_m = 12,
  mostly_q3_k_l = 13,
  mostly_q4_k_s = 14,
  mostly_q4_k_m = 15,
  mostly_q5_k_s = 16,
  mostly_q5_k_m = 17,
  mostly_q6_k = 18,
  mostly_q2_k_s = 21,
  mostly_iq4_nl = 25,
  mostly_iq4_xs = 30,
  mostly_bf16 = 32,
  mostly_mxfp4_moe = 38,
};

constexpr std::array<quantize_preset, 21> presets = {{
    {"Q4_0", mostly_q4_0, dtype::q4_0},
    {"Q4_1", mostly_q4_1, dtype::q4_1},
    {"Q5_0", mostly_q5_0, dtype::q5_0},
    {"Q5_1", mostly_q5_1, dtype::q5_1},
    {"Q8_0", mostly_q8_0, dtype::q8_0},
    {"Q2_K", mostly_q2_k, dtype::q2_k},
    {"Q2_K_S", mostly_q2_k_s, dtype::q2_k, false, true},
    {"Q3_K_S", mostly_q3_k_s, dtype::q3_k},
    {"Q3_K_M", mostly_q3_k_m, dtype::q3_k},
    {"Q3_K_L", mostly_q3_k_l, dtype::q3_k},
    {"Q4_K_S", mostly_q4_k_s, dtype::q4_k},
    {"Q4_K_M", mostly_q4_k_m, dtype::q4_k},
    {"Q5_K_S", mostly_q5_k_s, dtype::q5_k},
    {"Q5_K_M", mostly_q5_k_m, dtype::q5_k},
    {"Q6_K", mostly_q6_k, dtype::q6_k},
    {"IQ4_NL", mostly_iq4_nl, dtype::iq4_nl},
    {"IQ4_XS", mostly_iq4_xs, dtype::iq4_xs},
    {"MXFP4", mostly_mxfp4_moe, dtype::mxfp4, true},
    {"F16", mostly_f16, dtype::f16},
    {"BF16", mostly_bf16, dtype::bf16},
    {"F32", all_f32, dtype::f32},
}};

// llama-quantize's aliases: the bare k-quant names mean their _M mix.
constexpr std::array<std::pair<std::string_view, std::string_view>, 3> aliases = {{
    {"Q3_K", "Q3_K_M"},
    {"Q4_K", "Q4_K_M"},
    {"Q5_K", "Q5_K_M"},
}};

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::toupper(static_cast<unsigned char>(x)) == std::toupper(static_cast<unsigned char>(y));
         });
}

bool contains(const std::string& name, std::string_view part) { return name.find(part) != std::string::npos; }

bool ends_with(const std::string& name, std::string_view suffix) {
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The tensor roles the rules tell apart (llama.cpp's tensor_category).
enum class role { token_embedding, output, attention_v, attention_output, ffn_down, other };

role role_of(const std::string& name) {
  if (name == "output.weight") return role::output;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return role::token_embedding;
  // Fused QKV and MLA's kv_b carry the values: they are treated as attn_v.
  if (contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight") || contains(name, "attn_v.weight")) {
    return role::attention_v;
  }
  if (contains(name, "attn_output.weight")) return role::attention_output;
  if (contains(name, "ffn_down")) return role::ffn_down;
  return role::other;
}

// "blk.7.attn_v.weight" -> 7; -1 outside the layers.
int layer_of(const std::string& name) {
  int layer = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) return -1;
  return layer;
}

// llama.cpp's choice of layers that get more bits in the _M mixes: the first and last eighth,
// and every third layer between.
bool use_more_bits(int layer, int num_layers) {
  return layer < num_layers / 8 || layer >= 7 * num_layers / 8 || (layer - num_layers / 8) % 3 == 2;
}

bool is(const quantize_preset& preset, uint32_t type) { return preset.file_type == type; }

// The mix's rule for one tensor, before the fallback for rows that do not fit.
dtype mixed_type(const quantize_preset& preset, const model_facts& model, const tensor_facts& tensor, role r) {
  const dtype base = preset.base;
  const int gqa = model.num_kv_heads > 0 ? model.num_heads / model.num_kv_heads : 1;
  const int layer = layer_of(tensor.name);
  const int num_layers = model.num_layers;

  if (r == role::output || (r == role::token_embedding && model.tied_embeddings)) {
    if (is(preset, mostly_mxfp4_moe) && !preset.pure) return dtype::q8_0;
    if (tensor.columns % dtype_block_size(base) != 0) return dtype::q8_0;
    return base == dtype::q8_0 ? dtype::q8_0 : dtype::q6_k;
  }
  if (r == role::token_embedding) return base;
  if (r == role::attention_v) {
    dtype type = base;
    if (is(preset, mostly_q2_k)) {
      type = gqa >= 4 ? dtype::q4_k : dtype::q3_k;
    } else if (is(preset, mostly_q2_k_s) && gqa >= 4) {
      type = dtype::q4_k;
    } else if (is(preset, mostly_q3_k_m)) {
      type = layer < 2 ? dtype::q5_k : dtype::q4_k;
    } else if (is(preset, mostly_q3_k_l)) {
      type = dtype::q5_k;
    } else if ((is(preset, mostly_iq4_nl) || is(preset, mostly_iq4_xs)) && gqa >= 4) {
      type = dtype::q5_k;
    } else if ((is(preset, mostly_q4_k_m) || is(preset, mostly_q5_k_m)) && use_more_bits(layer, num_layers)) {
      type = dtype::q6_k;
    } else if (is(preset, mostly_q4_k_s) && layer < 4) {
      type = dtype::q5_k;
    }
    // Llama 2 70B's 8 query heads share each value head: its attn_v is small and sensitive.
    if (model.llama_70b && (type == dtype::q3_k || type == dtype::q4_k)) type = dtype::q5_k;
    if (model.num_experts == 8) type = dtype::q8_0;
    return type;
  }
  if (r == role::ffn_down) {
    if (is(preset, mostly_q2_k)) return dtype::q3_k;
    if (is(preset, mostly_q2_k_s)) return layer < num_layers / 8 ? dtype::q4_k : base;
    if (is(preset, mostly_q3_k_m)) return layer < num_layers / 16 ? dtype::q5_k : dtype::q4_k;
    if (is(preset, mostly_q3_k_l)) return dtype::q5_k;
    if (is(preset, mostly_q4_k_m)) return use_more_bits(layer, num_layers) ? dtype::q6_k : base;
    if (layer < num_layers / 8 && (is(preset, mostly_iq4_nl) || is(preset, mostly_iq4_xs)) && !model.has_importance) {
      return dtype::q5_k;
    }
    if (is(preset, mostly_q5_k_m)) return use_more_bits(layer, num_layers) ? dtype::q6_k : base;
    if (is(preset, mostly_q4_k_s)) return layer < num_layers / 8 ? dtype::q5_k : base;
    if ((is(preset, mostly_q4_0) || is(preset, mostly_q5_0)) && model.has_importance && layer < num_layers / 8) {
      // With an imatrix the first ffn_downs of Q4_0/Q5_0 can go wrong; llama.cpp then uses _1.
      return is(preset, mostly_q4_0) ? dtype::q4_1 : dtype::q5_1;
    }
    return base;
  }
  if (r == role::attention_output) {
    if (model.num_experts == 8) {
      const bool bump = is(preset, mostly_q2_k) || is(preset, mostly_q3_k_s) || is(preset, mostly_q3_k_m) ||
                        is(preset, mostly_iq4_nl) || is(preset, mostly_q4_k_s) || is(preset, mostly_q4_k_m) ||
                        is(preset, mostly_iq4_xs);
      return bump ? dtype::q5_k : base;
    }
    if (is(preset, mostly_q2_k)) return dtype::q3_k;
    if (is(preset, mostly_q3_k_m)) return dtype::q4_k;
    if (is(preset, mostly_q3_k_l)) return dtype::q5_k;
    return base;
  }
  return base;
}

// A type whose block does not divide the rows falls back as llama.cpp's does: to a 32-block
// type of about as many bits, or to F16 when even that does not fit.
tensor_choice fit_rows(dtype type, int64_t columns) {
  if (columns % dtype_block_size(type) == 0) return {type, false};
  dtype fallback = type;
  switch (type) {
    case dtype::iq4_xs: fallback = dtype::iq4_nl; break;
    case dtype::q2_k:
    case dtype::q3_k: fallback = dtype::q4_0; break;
    case dtype::q4_k: fallback = dtype::q5_0; break;
    case dtype::q5_k: fallback = dtype::q5_1; break;
    case dtype::q6_k: fallback = dtype::q8_0; break;
    default: break;
  }
  if (columns % dtype_block_size(fallback) != 0) fallback = dtype::f16;
  return {fallback, true};
}

}  // namespace

std::optional<quantize_preset> find_preset(std::string_view name) {
  for (const auto& [alias, target] : aliases) {
    if (same_name(name, alias)) name = target;
  }
  for (const quantize_preset& preset : presets) {
    if (same_name(name, preset.name)) return preset;
  }
  return std::nullopt;
}

std::string preset_names() {
  std::string names;
  for (const quantize_preset& preset : presets) names += (names.empty() ? "" : ", ") + std::string(preset.name);
  return names;
}

std::optional<quantize_preset> preset_of_file_type(uint32_t type) {
  for (const quantize_preset& preset : presets) {
    if (preset.file_type == type) return preset;
  }
  return std::nullopt;
}

bool is_quantizable(const std::string& name, int num_dims) {
  if (num_dims < 2 || !ends_with(name, "weight")) return false;
  for (std::string_view kept :
       {"_norm.weight", "ffn_gate_inp.weight", "position_embd", "token_types", "ssm_conv1d", "attn_rel_b.weight"}) {
    if (contains(name, kept)) return false;
  }
  return true;
}

tensor_choice choose_tensor_type(const quantize_preset& preset, bool pure, const model_facts& model,
                                 const tensor_facts& tensor) {
  if (!is_quantizable(tensor.name, tensor.num_dims)) return {tensor.current, false};
  // Plain types (F16, BF16, F32) have no mixes and no blocks.
  if (!is_quantized(preset.base)) return {preset.base, false};
  const dtype wanted = pure || preset.pure ? preset.base : mixed_type(preset, model, tensor, role_of(tensor.name));
  return fit_rows(wanted, tensor.columns);
}

}  // namespace troupe::quant
