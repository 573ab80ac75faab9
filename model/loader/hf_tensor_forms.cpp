#include "model/loader/hf_tensor_forms.hpp"

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

namespace troupe {
namespace {

const weight_tensor& checkpoint_tensor(const weight_store& store, const std::string& name,
                                       const std::vector<int64_t>& shape) {
  const weight_tensor* tensor = store.find(name);
  if (!tensor)
    throw std::runtime_error("checkpoint tensor " + name + " is missing; expected shape " + shape_string(shape));
  if (tensor->shape != shape) {
    throw std::runtime_error("checkpoint tensor " + name + " has shape " + shape_string(tensor->shape) + ", expected " +
                             shape_string(shape));
  }
  return *tensor;
}

// Row slices [first_row, first_row + rows) of a [*, cols] tensor, as a view named `name`.
void add_rows(weight_store& store, const weight_tensor& whole, const std::string& name, int64_t first_row,
              int64_t rows) {
  const size_t row_size = row_bytes(whole.type, whole.cols());
  weight_tensor part;
  part.name = name;
  part.type = whole.type;
  part.shape = whole.shape.size() == 1 ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, whole.cols()};
  part.data = whole.data + first_row * (whole.shape.size() == 1 ? row_bytes(whole.type, 1) : row_size);
  part.num_bytes = whole.shape.size() == 1 ? row_bytes(whole.type, rows) : row_size * rows;
  // A quantized checkpoint's row scales go with their rows; the column order is every row's.
  if (!whole.row_scales.empty()) {
    part.row_scales.assign(whole.row_scales.begin() + first_row, whole.row_scales.begin() + first_row + rows);
  }
  part.input_order = whole.input_order;
  store.add(std::move(part));
}

void adapt_phi3(const model_config& config, weight_store& store) {
  const model_tensor_names names = tensor_names(config);
  const int64_t hidden = config.hidden_size;
  const int64_t q_rows = int64_t{config.num_heads} * config.head_dim;
  const int64_t kv_rows = int64_t{config.num_kv_heads} * config.head_dim;
  const int64_t inter = config.intermediate_size;
  for (int i = 0; i < config.num_layers; ++i) {
    const layer_tensor_names& l = names.layers[i];
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    if (!store.contains(l.q_proj)) {
      const weight_tensor& qkv =
          checkpoint_tensor(store, prefix + "self_attn.qkv_proj.weight", {q_rows + 2 * kv_rows, hidden});
      add_rows(store, qkv, l.q_proj, 0, q_rows);
      add_rows(store, qkv, l.k_proj, q_rows, kv_rows);
      add_rows(store, qkv, l.v_proj, q_rows + kv_rows, kv_rows);
    }
    if (!store.contains(l.gate_proj)) {
      const weight_tensor& gate_up = checkpoint_tensor(store, prefix + "mlp.gate_up_proj.weight", {2 * inter, hidden});
      add_rows(store, gate_up, l.gate_proj, 0, inter);
      add_rows(store, gate_up, l.up_proj, inter, inter);
    }
  }
}

// Element (i, j) of each expert of a packed [experts, a, b] tensor goes to canonical place
// `place(i, j)` of the expert's matrix; elements move as bytes, so any plain dtype keeps its type.
template <typename Place>
std::shared_ptr<std::vector<std::byte>> repack(const weight_tensor& packed, int64_t expert, int64_t out_elements,
                                               Place place) {
  const size_t element = row_bytes(packed.type, 1);
  const int64_t a = packed.shape[1], b = packed.shape[2];
  auto buffer = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(out_elements) * element);
  const std::byte* src = packed.data + static_cast<size_t>(expert * a * b) * element;
  for (int64_t i = 0; i < a; ++i) {
    for (int64_t j = 0; j < b; ++j) {
      const int64_t to = place(i, j);
      if (to >= 0)
        std::memcpy(buffer->data() + static_cast<size_t>(to) * element, src + static_cast<size_t>(i * b + j) * element,
                    element);
    }
  }
  return buffer;
}

void add_owned(weight_store& store, const std::string& name, dtype type, std::vector<int64_t> shape,
               std::shared_ptr<std::vector<std::byte>> buffer) {
  weight_tensor tensor;
  tensor.name = name;
  tensor.type = type;
  tensor.shape = std::move(shape);
  tensor.data = buffer->data();
  tensor.num_bytes = buffer->size();
  store.keep_alive(buffer);
  store.add(std::move(tensor));
}

void adapt_gpt_oss(const model_config& config, weight_store& store) {
  const model_tensor_names names = tensor_names(config);
  const int64_t hidden = config.hidden_size;
  const int64_t inter = config.moe.expert_intermediate_size;
  const int64_t experts = config.moe.num_experts;
  for (int i = 0; i < config.num_layers; ++i) {
    const layer_tensor_names& l = names.layers[i];
    if (l.experts.empty() || store.contains(l.experts[0].gate_proj)) continue;
    const std::string p = "model.layers." + std::to_string(i) + ".mlp.experts.";
    if (store.contains(p + "gate_up_proj_blocks")) {
      throw std::runtime_error(
          "checkpoint tensor " + p +
          "gate_up_proj_blocks holds MXFP4 experts, which Troupe reads from GGUF files (llama.cpp's "
          "convert_hf_to_gguf.py keeps them MXFP4) or from a BF16 checkpoint, not from MXFP4 safetensors yet");
    }
    const weight_tensor& gate_up = checkpoint_tensor(store, p + "gate_up_proj", {experts, hidden, 2 * inter});
    const weight_tensor& gate_up_bias = checkpoint_tensor(store, p + "gate_up_proj_bias", {experts, 2 * inter});
    const weight_tensor& down = checkpoint_tensor(store, p + "down_proj", {experts, inter, hidden});
    const weight_tensor& down_bias = checkpoint_tensor(store, p + "down_proj_bias", {experts, hidden});
    for (const weight_tensor* t : {&gate_up, &gate_up_bias, &down, &down_bias}) {
      if (is_quantized(t->type)) throw std::runtime_error("checkpoint tensor " + t->name + " must be F32, F16 or BF16");
    }
    for (int64_t e = 0; e < experts; ++e) {
      const expert_tensor_names& x = l.experts[e];
      // gate_up[e][h][2 * k + s]: s = 0 is gate row k, s = 1 up row k, column h.
      add_owned(store, x.gate_proj, gate_up.type, {inter, hidden},
                repack(gate_up, e, inter * hidden,
                       [&](int64_t h, int64_t c) { return c % 2 == 0 ? (c / 2) * hidden + h : -1; }));
      add_owned(store, x.up_proj, gate_up.type, {inter, hidden},
                repack(gate_up, e, inter * hidden,
                       [&](int64_t h, int64_t c) { return c % 2 == 1 ? (c / 2) * hidden + h : -1; }));
      add_owned(store, x.down_proj, down.type, {hidden, inter},
                repack(down, e, hidden * inter, [&](int64_t k, int64_t h) { return h * inter + k; }));
      // Biases: [experts, 2 * inter] seen as [experts, 1, 2 * inter].
      weight_tensor bias_view = gate_up_bias;
      bias_view.shape = {experts, 1, 2 * inter};
      add_owned(store, x.gate_bias, gate_up_bias.type, {inter},
                repack(bias_view, e, inter, [](int64_t, int64_t c) { return c % 2 == 0 ? c / 2 : -1; }));
      add_owned(store, x.up_bias, gate_up_bias.type, {inter},
                repack(bias_view, e, inter, [](int64_t, int64_t c) { return c % 2 == 1 ? c / 2 : -1; }));
      weight_tensor down_bias_view = down_bias;
      down_bias_view.shape = {experts, 1, hidden};
      add_owned(store, x.down_bias, down_bias.type, {hidden},
                repack(down_bias_view, e, hidden, [](int64_t, int64_t c) { return c; }));
    }
  }
}

std::vector<float> concat(const std::vector<std::vector<float>>& parts) {
  std::vector<float> all;
  for (const auto& part : parts) all.insert(all.end(), part.begin(), part.end());
  return all;
}

}  // namespace

void adapt_hf_tensors(const model_config& config, weight_store& store) {
  if (config.arch == architecture::phi3) adapt_phi3(config, store);
  if (config.arch == architecture::gpt_oss) adapt_gpt_oss(config, store);
}

std::vector<hf_checkpoint_tensor> hf_checkpoint_tensors(
    const model_config& config, const std::function<std::vector<float>(const tensor_spec&)>& values_of) {
  const std::vector<tensor_spec> specs = expected_tensors(config);
  std::map<std::string, const tensor_spec*> by_name;
  for (const tensor_spec& spec : specs) by_name[spec.name] = &spec;
  auto values = [&](const std::string& name) { return values_of(*by_name.at(name)); };
  const model_tensor_names names = tensor_names(config);
  std::set<std::string> packed;  // canonical tensors written inside a packed checkpoint tensor
  std::vector<hf_checkpoint_tensor> out;
  for (int i = 0; i < config.num_layers; ++i) {
    const layer_tensor_names& l = names.layers[i];
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    if (config.arch == architecture::phi3) {
      const int64_t rows = by_name.at(l.q_proj)->shape[0] + 2 * by_name.at(l.k_proj)->shape[0];
      out.push_back({prefix + "self_attn.qkv_proj.weight",
                     {rows, config.hidden_size},
                     concat({values(l.q_proj), values(l.k_proj), values(l.v_proj)})});
      out.push_back({prefix + "mlp.gate_up_proj.weight",
                     {2 * int64_t{config.intermediate_size}, config.hidden_size},
                     concat({values(l.gate_proj), values(l.up_proj)})});
      packed.insert({l.q_proj, l.k_proj, l.v_proj, l.gate_proj, l.up_proj});
    }
    if (config.arch == architecture::gpt_oss && !l.experts.empty()) {
      const int64_t experts = config.moe.num_experts, hidden = config.hidden_size,
                    inter = config.moe.expert_intermediate_size;
      hf_checkpoint_tensor gate_up{prefix + "mlp.experts.gate_up_proj", {experts, hidden, 2 * inter}, {}};
      hf_checkpoint_tensor gate_up_bias{prefix + "mlp.experts.gate_up_proj_bias", {experts, 2 * inter}, {}};
      hf_checkpoint_tensor down{prefix + "mlp.experts.down_proj", {experts, inter, hidden}, {}};
      hf_checkpoint_tensor down_bias{prefix + "mlp.experts.down_proj_bias", {experts, hidden}, {}};
      gate_up.values.resize(experts * hidden * 2 * inter);
      gate_up_bias.values.resize(experts * 2 * inter);
      down.values.resize(experts * inter * hidden);
      for (int64_t e = 0; e < experts; ++e) {
        const expert_tensor_names& x = l.experts[e];
        const std::vector<float> gate = values(x.gate_proj), up = values(x.up_proj), d = values(x.down_proj);
        const std::vector<float> gate_b = values(x.gate_bias), up_b = values(x.up_bias), down_b = values(x.down_bias);
        float* gu = gate_up.values.data() + e * hidden * 2 * inter;  // [hidden, 2 * inter]
        for (int64_t k = 0; k < inter; ++k) {
          for (int64_t h = 0; h < hidden; ++h) {
            gu[h * 2 * inter + 2 * k] = gate[k * hidden + h];
            gu[h * 2 * inter + 2 * k + 1] = up[k * hidden + h];
          }
          gate_up_bias.values[e * 2 * inter + 2 * k] = gate_b[k];
          gate_up_bias.values[e * 2 * inter + 2 * k + 1] = up_b[k];
        }
        float* dn = down.values.data() + e * inter * hidden;  // [inter, hidden]
        for (int64_t h = 0; h < hidden; ++h)
          for (int64_t k = 0; k < inter; ++k) dn[k * hidden + h] = d[h * inter + k];
        down_bias.values.insert(down_bias.values.end(), down_b.begin(), down_b.end());
        packed.insert({x.gate_proj, x.up_proj, x.down_proj, x.gate_bias, x.up_bias, x.down_bias});
      }
      out.push_back(std::move(gate_up));
      out.push_back(std::move(gate_up_bias));
      out.push_back(std::move(down));
      out.push_back(std::move(down_bias));
    }
  }
  std::vector<hf_checkpoint_tensor> all;
  for (const tensor_spec& spec : specs) {
    if (!packed.count(spec.name)) all.push_back({spec.name, spec.shape, values_of(spec)});
  }
  all.insert(all.end(), std::make_move_iterator(out.begin()), std::make_move_iterator(out.end()));
  return all;
}

}  // namespace troupe
