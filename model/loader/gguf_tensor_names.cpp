#include "model/loader/gguf_tensor_names.hpp"

#include <cstdlib>
#include <map>
#include <stdexcept>
#include <utility>

#include "model/architecture.hpp"
#include "model/model_tensors.hpp"

namespace troupe {
namespace {

// Per-layer parts of the Llama family: GGUF name part, HF name part (without ".weight"/".bias").
constexpr std::pair<const char*, const char*> layer_parts[] = {
    {"attn_norm", "input_layernorm"},    {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},      {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"}, {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"}, {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},       {"ffn_up", "mlp.up_proj"},
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

// Builds the plan of one model, tensor by tensor.
class layout_builder {
 public:
  explicit layout_builder(const model_config& config) : config_(config), names_(tensor_names(config)) {
    const architecture_traits& traits = traits_of(config.arch);
    norm_plus_one_ = traits.norm == norm_kind::rms_one_plus;
    permuted_ = traits.gguf_permuted_qk;
    for (const tensor_spec& spec : expected_tensors(config)) shapes_[spec.name] = spec.shape;
  }

  std::vector<gguf_tensor_layout> build() {
    one("token_embd.weight", names_.embed_tokens);
    for (int i = 0; i < config_.num_layers; ++i) add_layer(i, names_.layers[i]);
    norm("output_norm.weight", names_.final_norm);
    if (names_.lm_head != names_.embed_tokens) one("output.weight", names_.lm_head);
    return std::move(layouts_);
  }

 private:
  void add_layer(int index, const layer_tensor_names& l) {
    const std::string blk = "blk." + std::to_string(index) + ".";
    const architecture arch = config_.arch;
    norm(blk + "attn_norm.weight", l.attn_norm);
    if (traits_of(arch).fused_qkv) {
      const int64_t q_rows = int64_t{config_.num_heads} * config_.head_dim;
      const int64_t kv_rows = int64_t{config_.num_kv_heads} * config_.head_dim;
      stacked(blk + "attn_qkv.weight", {l.q_proj, l.k_proj, l.v_proj}, {q_rows, kv_rows, kv_rows});
      if (!l.q_bias.empty()) stacked(blk + "attn_qkv.bias", {l.q_bias, l.k_bias, l.v_bias}, {q_rows, kv_rows, kv_rows});
    } else {
      one(blk + "attn_q.weight", l.q_proj, permuted_ ? config_.num_heads : 0);
      one(blk + "attn_k.weight", l.k_proj, permuted_ ? config_.num_kv_heads : 0);
      one(blk + "attn_v.weight", l.v_proj);
      one(blk + "attn_q.bias", l.q_bias, permuted_ ? config_.num_heads : 0);
      one(blk + "attn_k.bias", l.k_bias, permuted_ ? config_.num_kv_heads : 0);
      one(blk + "attn_v.bias", l.v_bias);
    }
    norm(blk + "attn_q_norm.weight", l.q_norm);
    norm(blk + "attn_k_norm.weight", l.k_norm);
    one(blk + "attn_output.weight", l.o_proj);
    one(blk + "attn_output.bias", l.o_bias);
    one(blk + "attn_sinks.weight", l.sinks);
    norm(blk + "post_attention_norm.weight", l.attn_post_norm);
    // gpt-oss's pre-MLP norm is "post_attention_norm" in GGUF (its name in HF), everyone else's "ffn_norm".
    norm(blk + (arch == architecture::gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight"), l.ffn_norm);
    if (traits_of(arch).fused_gate_up) {
      stacked(blk + "ffn_up.weight", {l.gate_proj, l.up_proj}, {});
    } else {
      one(blk + "ffn_gate.weight", l.gate_proj);
      one(blk + "ffn_up.weight", l.up_proj);
    }
    one(blk + "ffn_down.weight", l.down_proj);
    one(blk + "ffn_gate_inp.weight", l.router);
    one(blk + "ffn_gate_inp.bias", l.router_bias);
    if (!l.experts.empty()) {
      auto all = [&](std::string expert_tensor_names::*field) {
        std::vector<std::string> parts;
        for (const auto& e : l.experts) parts.push_back(e.*field);
        return parts;
      };
      stacked(blk + "ffn_gate_exps.weight", all(&expert_tensor_names::gate_proj), {});
      stacked(blk + "ffn_up_exps.weight", all(&expert_tensor_names::up_proj), {});
      stacked(blk + "ffn_down_exps.weight", all(&expert_tensor_names::down_proj), {});
      if (!l.experts.front().gate_bias.empty()) {
        stacked(blk + "ffn_gate_exps.bias", all(&expert_tensor_names::gate_bias), {});
        stacked(blk + "ffn_up_exps.bias", all(&expert_tensor_names::up_bias), {});
        stacked(blk + "ffn_down_exps.bias", all(&expert_tensor_names::down_bias), {});
      }
    }
    if (!l.shared_expert_gate.empty()) {
      one(blk + "ffn_gate_inp_shexp.weight", l.shared_expert_gate);
      layouts_.back().gguf_1d = true;
      one(blk + "ffn_gate_shexp.weight", l.shared_gate_proj);
      one(blk + "ffn_up_shexp.weight", l.shared_up_proj);
      one(blk + "ffn_down_shexp.weight", l.shared_down_proj);
    }
    norm(blk + "post_ffw_norm.weight", l.ffn_post_norm);
  }

  void one(const std::string& gguf_name, const std::string& part, int permuted_heads = 0) {
    if (part.empty()) return;
    gguf_tensor_layout layout;
    layout.gguf_name = gguf_name;
    layout.parts = {part};
    layout.shape = shapes_.at(part);
    layout.permuted_heads = permuted_heads;
    layouts_.push_back(std::move(layout));
  }

  void norm(const std::string& gguf_name, const std::string& part) {
    one(gguf_name, part);
    if (!part.empty()) layouts_.back().norm_plus_one = norm_plus_one_;
  }

  // Parts stacked along the outermost dimension. A part of shape [r, c] adds r rows; a 1-D part
  // of n values adds n. Experts (all the same shape) stack into [experts, r, c] as llama.cpp
  // wants; differing parts (qkv) concatenate their rows.
  void stacked(const std::string& gguf_name, const std::vector<std::string>& parts, std::vector<int64_t> part_rows) {
    gguf_tensor_layout layout;
    layout.gguf_name = gguf_name;
    layout.parts = parts;
    const std::vector<int64_t>& first = shapes_.at(parts.front());
    const bool experts = gguf_name.find("_exps.") != std::string::npos;
    if (experts) {
      layout.shape = first;
      layout.shape.insert(layout.shape.begin(), static_cast<int64_t>(parts.size()));
    } else {
      int64_t rows = 0;
      for (const std::string& part : parts) rows += shapes_.at(part).front();
      layout.shape = first;
      layout.shape.front() = rows;
      layout.part_rows = std::move(part_rows);
    }
    layouts_.push_back(std::move(layout));
  }

  const model_config& config_;
  model_tensor_names names_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  bool norm_plus_one_ = false;
  bool permuted_ = false;
  std::vector<gguf_tensor_layout> layouts_;
};

}  // namespace

std::vector<gguf_tensor_layout> gguf_tensor_layouts(const model_config& config) {
  return layout_builder(config).build();
}

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
