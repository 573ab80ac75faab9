// One forward step of a decoder-only transformer on the CPU: a straight loop over layers, each
// built from the shared blocks (norm, attention, MLP or mixture of experts, post-norms) as the
// architecture's description says (model/architecture.hpp), every intermediate named, all
// buffers owned by the model and reused from step to step.

#include "backends/cpu/cpu_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/blas_core.hpp"
#include "backends/cpu/embedding.hpp"
#include "backends/cpu/quant_repack.hpp"
#include "backends/cpu/gated_activation.hpp"
#include "backends/cpu/huge_page_weights.hpp"
#include "backends/cpu/kv_pool.hpp"
#include "backends/cpu/matmul.hpp"
#include "backends/cpu/moe_layer.hpp"
#include "backends/cpu/paged_attention.hpp"
#include "backends/cpu/rms_norm.hpp"
#include "backends/cpu/rope.hpp"
#include "backends/cpu/row_kernels.hpp"
#include "backends/cpu/simd_level.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "model/architecture.hpp"
#include "model/model_tensors.hpp"
#include "model/rope_frequencies.hpp"

namespace troupe {

namespace {

using cpu::weight_view;

// A small tensor (norm weight, bias) of any dtype as f32, checked to hold `size` elements.
std::vector<float> small_tensor_f32(const weight_tensor& tensor, int64_t size) {
  if (tensor.num_elements() != size) {
    throw std::runtime_error("tensor '" + tensor.name + "' has " + std::to_string(tensor.num_elements()) +
                             " elements, expected " + std::to_string(size));
  }
  std::vector<float> values(size);
  cpu::scalar_row_kernels().to_f32[static_cast<int>(tensor.type)](tensor.data, size, values.data());
  return values;
}

void check_config(const model_config& c) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error("model config: " + what);
  };
  require(c.hidden_size > 0, "hidden_size must be positive");
  require(c.intermediate_size > 0, "intermediate_size must be positive");
  require(c.num_layers > 0, "num_layers must be positive");
  require(c.num_heads > 0 && c.num_kv_heads > 0, "num_heads and num_kv_heads must be positive");
  require(c.num_heads % c.num_kv_heads == 0, "num_heads (" + std::to_string(c.num_heads) +
                                                 ") must be a multiple of num_kv_heads (" +
                                                 std::to_string(c.num_kv_heads) + ")");
  require(c.head_dim > 0 && c.head_dim % 2 == 0, "head_dim must be positive and even");
  require(c.vocab_size > 0, "vocab_size must be positive");
  if (c.moe.num_experts > 0) {
    require(c.moe.experts_per_token > 0 && c.moe.experts_per_token <= c.moe.num_experts,
            "experts_per_token must be in 1..num_experts");
    require(c.moe.expert_intermediate_size > 0, "expert_intermediate_size must be positive");
  }
  require(c.attn_logit_softcapping >= 0.0f, "attn_logit_softcapping must not be negative");
  require(c.sliding_window >= 0, "sliding_window must not be negative");
  require(c.sliding_layers.empty() || static_cast<int>(c.sliding_layers.size()) == c.num_layers,
          "sliding_layers must have one flag per layer (" + std::to_string(c.num_layers) + ")");
}

// A norm's weights as the multiplier the CPU applies: (1 + w) for Gemma's norms.
std::vector<float> norm_weights(const weight_tensor& tensor, int64_t size, norm_kind kind) {
  std::vector<float> values = small_tensor_f32(tensor, size);
  if (kind == norm_kind::rms_one_plus) {
    for (float& v : values) v += 1.0f;
  }
  return values;
}

class cpu_model final : public model {
 public:
  cpu_model(const model_config& config, const weight_store& weights, kv_cache_shape kv_shape, int num_threads,
            dtype kv_dtype, layer_range stage)
      : config_(with_head_dim(config)),
        traits_(traits_of(config_.arch)),
        stage_(checked_stage(config_, stage)),
        pool_(num_threads),
        kv_(with_layers(config_, stage_.count()), kv_shape, kv_dtype) {
    check_config(config_);
    const model_config& c = config_;
    const int64_t hidden = c.hidden_size;
    const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
    const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
    const norm_kind norm = traits_.norm;

    // Which tensors the model has (biases, q/k norms, post-norms, experts, its own lm_head) is
    // the loader's list; each layer is built from what it names.
    // A pipeline stage reads only its own tensors: the embedding on the first, the head on the last.
    const model_tensor_names names = tensor_names(c);
    if (stage_.holds_embedding()) embed_tokens_ = cpu::view_of(weights.get(names.embed_tokens), c.vocab_size, hidden);
    if (stage_.holds_head(c.num_layers)) {
      lm_head_ = cpu::view_of(weights.get(names.lm_head), c.vocab_size, hidden);
      final_norm_ = norm_weights(weights.get(names.final_norm), hidden, norm);
    }
    activation_ = {c.activation, c.swiglu_alpha, c.swiglu_limit};

    layers_.resize(stage_.count());
    for (int i = stage_.first; i < stage_.end; ++i) {
      const layer_tensor_names& n = names.layers[i];
      auto tensor = [&](const std::string& name) -> const weight_tensor& { return weights.get(name); };
      auto optional_f32 = [&](const std::string& name, int64_t size) {
        return name.empty() ? std::vector<float>{} : small_tensor_f32(tensor(name), size);
      };
      auto optional_norm = [&](const std::string& name, int64_t size) {
        return name.empty() ? std::vector<float>{} : norm_weights(tensor(name), size, norm);
      };
      layer_weights& layer = layers_[i - stage_.first];
      layer.attn_norm = norm_weights(tensor(n.attn_norm), hidden, norm);
      layer.ffn_norm = norm_weights(tensor(n.ffn_norm), hidden, norm);
      layer.attn_post_norm = optional_norm(n.attn_post_norm, hidden);
      layer.ffn_post_norm = optional_norm(n.ffn_post_norm, hidden);
      layer.q_proj = cpu::view_of(tensor(n.q_proj), q_dim, hidden);
      layer.k_proj = cpu::view_of(tensor(n.k_proj), kv_dim, hidden);
      layer.v_proj = cpu::view_of(tensor(n.v_proj), kv_dim, hidden);
      layer.o_proj = cpu::view_of(tensor(n.o_proj), hidden, q_dim);
      layer.q_bias = optional_f32(n.q_bias, q_dim);
      layer.k_bias = optional_f32(n.k_bias, kv_dim);
      layer.v_bias = optional_f32(n.v_bias, kv_dim);
      layer.o_bias = optional_f32(n.o_bias, hidden);
      layer.q_norm = optional_norm(n.q_norm, c.head_dim);
      layer.k_norm = optional_norm(n.k_norm, c.head_dim);
      layer.sinks = optional_f32(n.sinks, c.num_heads);
      layer.window = i < static_cast<int>(c.sliding_layers.size()) && c.sliding_layers[i] ? c.sliding_window : 0;
      layer.rope = rope_for_layer(c, i);
      if (n.experts.empty()) {
        layer.gate_proj = cpu::view_of(tensor(n.gate_proj), c.intermediate_size, hidden);
        layer.up_proj = cpu::view_of(tensor(n.up_proj), c.intermediate_size, hidden);
        layer.down_proj = cpu::view_of(tensor(n.down_proj), hidden, c.intermediate_size);
      } else {
        layer.moe.emplace(c.moe, activation_, hidden, moe_weights_of(n, weights));
      }
    }
    repack_weights_for_decode(names, weights);
    attention_params_ = {c.num_heads,         c.num_kv_heads,     c.head_dim, kv_shape.block_size,
                         kv_shape.num_blocks, attention_scale(c), kv_dtype};
    attention_params_.softcap = c.attn_logit_softcapping;
  }

  const model_config& config() const override { return config_; }
  kv_cache_shape kv_shape() const override { return kv_.shape(); }
  std::string backend_name() const override {
    const std::string stage = stage_.whole(config_.num_layers) ? "" : ", layers " + layer_range_text(stage_);
    return "cpu (" + std::string(cpu::simd_level_name(cpu::active_simd_level())) + ", " +
           std::to_string(pool_.num_threads()) + " threads, KV " + std::string(dtype_name(kv_.element())) + stage +
           ", " + blas_core_text() + ")";
  }

  dtype kv_dtype() const override { return kv_.element(); }

  // The OpenBLAS kernels prompts run on, and what to do when they are below this CPU (a program
  // that did not restart itself with cpu::restart_with_blas_settings).
  static std::string blas_core_text() {
    const std::string core = cpu::blas_core_name();
    const std::string better = cpu::better_blas_core(cpu::detected_simd_level(), core);
    if (better.empty()) return "OpenBLAS " + core;
    return "OpenBLAS " + core + ", below this CPU: set OPENBLAS_CORETYPE=" + better;
  }

  void export_kv(std::span<const int32_t> block_ids, int first_layer, int num_layers, dtype element,
                 std::span<std::byte> out) const override {
    const kv_span_header header =
        kv_span_for(config_, kv_.shape(), static_cast<int>(block_ids.size()), first_layer, num_layers, element);
    check_kv_transfer(config_, kv_.shape(), block_ids, header, out.size(), kv_transfer_direction::export_from_pool);
    kv_.export_blocks(block_ids, in_stage(header), out);
  }

  void import_kv(std::span<const int32_t> block_ids, const kv_span_header& header,
                 std::span<const std::byte> data) override {
    check_kv_transfer(config_, kv_.shape(), block_ids, header, data.size(), kv_transfer_direction::import_into_pool);
    kv_.import_blocks(block_ids, in_stage(header), data);
  }

  void forward(const forward_batch& batch, float* logits) override {
    check_batch(batch);
    const model_config& c = config_;
    const int64_t n = batch.num_tokens();
    const int64_t hidden = c.hidden_size;
    reserve(n, batch.num_logits());
    float* x = x_.data();      // [n, hidden] the residual stream
    float* h = h_.data();      // [n, hidden] normed input of a block
    float* out = out_.data();  // [n, hidden] a block's output

    if (batch.residual_in != nullptr) {  // a later pipeline stage: where the previous one left off
      std::memcpy(x, batch.residual_in, static_cast<size_t>(n * hidden) * sizeof(float));
    } else {
      if (n > 0) cpu::embedding_lookup(pool_, embed_tokens_, batch.token_ids.data(), n, x);
      if (traits_.scale_embeddings) scale(x, n * hidden, std::sqrt(static_cast<float>(hidden)));  // Gemma
    }
    for (int i = 0; i < stage_.count(); ++i) {
      const layer_weights& layer = layers_[i];
      norm(x, n, layer.attn_norm, h);
      attention_block(i, layer, batch, h, out);
      if (!layer.attn_post_norm.empty()) norm(out, n, layer.attn_post_norm, out);
      add_in_place(x, out, n * hidden);

      norm(x, n, layer.ffn_norm, h);
      if (layer.moe) {
        layer.moe->forward(pool_, h, n, out, moe_workspace_);
      } else {
        mlp_block(layer, h, n, out);
      }
      if (!layer.ffn_post_norm.empty()) norm(out, n, layer.ffn_post_norm, out);
      add_in_place(x, out, n * hidden);
    }
    if (batch.residual_out != nullptr) {  // an earlier pipeline stage: the next one goes on from here
      std::memcpy(batch.residual_out, x, static_cast<size_t>(n * hidden) * sizeof(float));
      return;
    }

    // Hidden states (embeddings) for the rows asked for, normed as the logits' rows are.
    if (!batch.hidden_rows.empty()) {
      if (batch.hidden_out == nullptr) throw std::invalid_argument("cpu_model: hidden_rows without hidden_out");
      const int64_t num_hidden = static_cast<int64_t>(batch.hidden_rows.size());
      for (int64_t r = 0; r < num_hidden; ++r) {
        const int32_t row = batch.hidden_rows[static_cast<size_t>(r)];
        if (row < 0 || row >= n)
          throw std::invalid_argument("cpu_model: hidden row " + std::to_string(row) + " outside the batch");
        std::memcpy(batch.hidden_out + r * hidden, x + static_cast<int64_t>(row) * hidden, hidden * sizeof(float));
      }
      cpu::rms_norm(pool_, batch.hidden_out, num_hidden, hidden, final_norm_.data(), c.rms_norm_eps, batch.hidden_out);
    }

    // Logits only for the rows asked for.
    const int64_t num_logits = batch.num_logits();
    if (num_logits == 0) return;
    float* last = logits_hidden_.data();  // [num_logits, hidden]
    for (int64_t r = 0; r < num_logits; ++r) {
      std::memcpy(last + r * hidden, x + static_cast<int64_t>(batch.logits_rows[r]) * hidden, hidden * sizeof(float));
    }
    norm(last, num_logits, final_norm_, last);
    cpu::matmul(pool_, last, num_logits, lm_head_, logits, scratch_);  // [num_logits, vocab]
    if (c.final_logit_softcapping > 0) {                               // Gemma 2: cap * tanh(logits / cap)
      const float cap = c.final_logit_softcapping;
      for (int64_t i = 0; i < num_logits * c.vocab_size; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
    }
  }

 private:
  struct layer_weights {
    std::vector<float> attn_norm, ffn_norm;            // [hidden], as multipliers
    std::vector<float> attn_post_norm, ffn_post_norm;  // [hidden]; empty if none (Gemma has them)
    weight_view q_proj, k_proj, v_proj, o_proj;
    std::vector<float> q_bias, k_bias, v_bias;  // [q_dim], [kv_dim], [kv_dim]; empty if none
    std::vector<float> o_bias;                  // [hidden]; empty if none
    std::vector<float> q_norm, k_norm;          // [head_dim]; empty if none
    std::vector<float> sinks;                   // [num_heads] attention sink logits; empty if none (gpt-oss has them)
    int window = 0;                             // a sliding layer's window; 0 for full attention
    rope_parameters rope;                       // this layer's frequencies (Gemma 3: local or global)
    weight_view gate_proj, up_proj, down_proj;  // the dense MLP (no views in a MoE layer)
    std::optional<cpu::moe_layer> moe;
  };

  // Attention block of the stage's layer `index` (its pool's numbering; the model's layer is
  // stage_.first + index): h [n, hidden] (normed) -> out [n, hidden].
  void attention_block(int index, const layer_weights& layer, const forward_batch& batch, const float* h, float* out) {
    const model_config& c = config_;
    const int64_t n = batch.num_tokens();
    const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
    const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
    float* q = q_.data();        // [n, num_heads, head_dim]
    float* k = k_.data();        // [n, num_kv_heads, head_dim]
    float* v = v_.data();        // [n, num_kv_heads, head_dim]
    float* attn = attn_.data();  // [n, num_heads, head_dim]
    cpu::matmul(pool_, h, n, layer.q_proj, q, scratch_);
    cpu::matmul(pool_, h, n, layer.k_proj, k, scratch_);
    cpu::matmul(pool_, h, n, layer.v_proj, v, scratch_);
    add_bias(q, n, layer.q_bias);
    add_bias(k, n, layer.k_bias);
    add_bias(v, n, layer.v_bias);
    if (!layer.q_norm.empty()) {  // Qwen3, Gemma 3: RMSNorm over each head's head_dim, before RoPE
      cpu::rms_norm(pool_, q, n * c.num_heads, c.head_dim, layer.q_norm.data(), c.rms_norm_eps, q);
      cpu::rms_norm(pool_, k, n * c.num_kv_heads, c.head_dim, layer.k_norm.data(), c.rms_norm_eps, k);
    }
    cpu::apply_rope(pool_, q, q_dim, c.num_heads, k, kv_dim, c.num_kv_heads, n, c.head_dim, batch.positions.data(),
                    layer.rope);
    kv_.write(index, k, v, kv_dim, batch.slot_mapping.data(), n);
    if (batch.after_layer_kv) batch.after_layer_kv(stage_.first + index);
    cpu::attention_params params = attention_params_;
    params.window = layer.window;
    params.sinks = layer.sinks.empty() ? nullptr : layer.sinks.data();
    cpu::paged_attention(pool_, q, q_dim, kv_.keys(index), kv_.values(index), batch, params, attn, q_dim,
                         attention_workspace_);
    cpu::matmul(pool_, attn, n, layer.o_proj, out, scratch_);  // out: [n, hidden]
    add_bias(out, n, layer.o_bias);
  }

  // Dense gated MLP: h [n, hidden] -> out [n, hidden].
  void mlp_block(const layer_weights& layer, const float* h, int64_t n, float* out) {
    const int64_t inter = config_.intermediate_size;
    float* gate = gate_.data();  // [n, intermediate]
    float* up = up_.data();      // [n, intermediate]
    cpu::matmul(pool_, h, n, layer.gate_proj, gate, scratch_);
    cpu::matmul(pool_, h, n, layer.up_proj, up, scratch_);
    cpu::gated_activation(pool_, activation_, gate, up, inter, n, inter, gate, inter);  // gate: act(gate) * up
    cpu::matmul(pool_, gate, n, layer.down_proj, out, scratch_);
  }

  void norm(const float* in, int64_t rows, const std::vector<float>& weight, float* out) {
    cpu::rms_norm(pool_, in, rows, config_.hidden_size, weight.data(), config_.rms_norm_eps, out);
  }

  cpu::moe_weights moe_weights_of(const layer_tensor_names& n, const weight_store& weights) const {
    const model_config& c = config_;
    const int64_t hidden = c.hidden_size;
    const int64_t inter = c.moe.expert_intermediate_size;
    cpu::moe_weights w;
    w.router = cpu::view_of(weights.get(n.router), c.moe.num_experts, hidden);
    if (!n.router_bias.empty()) w.router_bias = small_tensor_f32(weights.get(n.router_bias), c.moe.num_experts);
    for (const expert_tensor_names& x : n.experts) {
      cpu::expert_weights e;
      e.gate = cpu::view_of(weights.get(x.gate_proj), inter, hidden);
      e.up = cpu::view_of(weights.get(x.up_proj), inter, hidden);
      e.down = cpu::view_of(weights.get(x.down_proj), hidden, inter);
      if (!x.gate_bias.empty()) {
        e.gate_bias = small_tensor_f32(weights.get(x.gate_bias), inter);
        e.up_bias = small_tensor_f32(weights.get(x.up_bias), inter);
        e.down_bias = small_tensor_f32(weights.get(x.down_bias), hidden);
      }
      w.experts.push_back(std::move(e));
    }
    if (!n.shared_gate_proj.empty()) {
      const int64_t shared = c.moe.shared_expert_intermediate_size;
      w.shared_gate = cpu::view_of(weights.get(n.shared_gate_proj), shared, hidden);
      w.shared_up = cpu::view_of(weights.get(n.shared_up_proj), shared, hidden);
      w.shared_down = cpu::view_of(weights.get(n.shared_down_proj), hidden, shared);
      w.shared_expert_gate = cpu::view_of(weights.get(n.shared_expert_gate), 1, hidden);
    }
    return w;
  }

  static model_config with_head_dim(model_config config) {
    if (config.head_dim == 0 && config.num_heads > 0) config.head_dim = config.hidden_size / config.num_heads;
    return config;
  }

  static layer_range checked_stage(const model_config& config, layer_range stage) {
    stage = stage.resolved(config.num_layers);
    check_layer_range(stage, config.num_layers);
    return stage;
  }

  static model_config with_layers(model_config config, int num_layers) {
    config.num_layers = num_layers;
    if (!config.sliding_layers.empty()) config.sliding_layers.resize(static_cast<size_t>(num_layers));
    return config;
  }

  // A KV span of the model's layers as this stage's pool numbers them; throws
  // std::invalid_argument for layers another stage holds.
  kv_span_header in_stage(kv_span_header header) const {
    if (!stage_.holds(header.first_layer) || !stage_.holds(header.first_layer + header.num_layers - 1)) {
      throw std::invalid_argument("KV layers " + std::to_string(header.first_layer) + "-" +
                                  std::to_string(header.first_layer + header.num_layers - 1) +
                                  " are not all in this pipeline stage (layers " + layer_range_text(stage_) + ")");
    }
    header.first_layer -= stage_.first;
    return header;
  }

  void check_batch(const forward_batch& batch) const {
    const size_t n = batch.token_ids.size();
    const bool first = stage_.holds_embedding();
    const bool last = stage_.holds_head(config_.num_layers);
    if (first != (batch.residual_in == nullptr)) {
      throw std::runtime_error(first
                                   ? "forward_batch: residual_in given to the first pipeline stage, which embeds tokens"
                                   : "forward_batch: pipeline stage of layers " + layer_range_text(stage_) +
                                         " needs residual_in (the previous stage's output)");
    }
    if (last != (batch.residual_out == nullptr)) {
      throw std::runtime_error(
          last ? "forward_batch: residual_out given to the last pipeline stage, which computes logits"
               : "forward_batch: pipeline stage of layers " + layer_range_text(stage_) +
                     " needs residual_out (the next stage's input)");
    }
    if (!last && (!batch.logits_rows.empty() || !batch.hidden_rows.empty())) {
      throw std::runtime_error("forward_batch: logits or hidden rows asked of pipeline stage " +
                               layer_range_text(stage_) + "; only the last stage computes them");
    }
    if (batch.positions.size() != n || batch.slot_mapping.size() != n) {
      throw std::runtime_error("forward_batch: token_ids, positions and slot_mapping have " + std::to_string(n) + ", " +
                               std::to_string(batch.positions.size()) + " and " +
                               std::to_string(batch.slot_mapping.size()) + " entries, expected the same count");
    }
    for (int32_t row : batch.logits_rows) {
      if (row < 0 || row >= static_cast<int32_t>(n)) {
        throw std::runtime_error("forward_batch: logits row " + std::to_string(row) + " is outside the batch of " +
                                 std::to_string(n) + " tokens");
      }
    }
    cpu::check_attention_batch(batch, attention_params_);
  }

  // Grows the step buffers to n tokens; capacity is kept, so steady-state steps never allocate.
  void reserve(int64_t n, int64_t num_logits) {
    const model_config& c = config_;
    auto grow = [](std::vector<float>& buffer, int64_t size) {
      if (buffer.size() < static_cast<size_t>(size)) buffer.resize(size);
    };
    const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
    const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
    grow(x_, n * c.hidden_size);
    grow(h_, n * c.hidden_size);
    grow(out_, n * c.hidden_size);
    grow(q_, n * q_dim);
    grow(k_, n * kv_dim);
    grow(v_, n * kv_dim);
    grow(attn_, n * q_dim);
    grow(gate_, n * c.intermediate_size);
    grow(up_, n * c.intermediate_size);
    grow(logits_hidden_, num_logits * c.hidden_size);
  }

  static void add_bias(float* rows, int64_t n, const std::vector<float>& bias) {
    const int64_t dim = static_cast<int64_t>(bias.size());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < dim; ++i) rows[r * dim + i] += bias[i];
  }

  static void add_in_place(float* x, const float* y, int64_t count) {
    for (int64_t i = 0; i < count; ++i) x[i] += y[i];
  }

  static void scale(float* x, int64_t count, float factor) {
    for (int64_t i = 0; i < count; ++i) x[i] *= factor;
  }

  // The dense matrices whose type has a repacked layout are copied into it once (quant_repack.hpp);
  // their GGUF pages are then dropped from this process's memory unless the embedding reads them
  // too (tied lm_head), so the resident weights stay one copy. The loader's own copies (un-permuted
  // q/k) cannot be dropped that way: cpu_weights_not_read names them for the store's owner to free.
  void repack_weights_for_decode(const model_tensor_names& names, const weight_store& weights) {
    std::vector<weight_view*> dense;
    std::vector<std::string> dense_names;  // the store's name of each
    for (int i = 0; i < stage_.count(); ++i) {
      layer_weights& layer = layers_[i];
      const layer_tensor_names& n = names.layers[stage_.first + i];
      const std::pair<weight_view*, const std::string*> matrices[] = {
          {&layer.q_proj, &n.q_proj},      {&layer.k_proj, &n.k_proj},       {&layer.v_proj, &n.v_proj},
          {&layer.o_proj, &n.o_proj},      {&layer.gate_proj, &n.gate_proj}, {&layer.up_proj, &n.up_proj},
          {&layer.down_proj, &n.down_proj}};
      for (const auto& [w, name] : matrices) {
        if (w->data == nullptr) continue;
        dense.push_back(w);
        dense_names.push_back(*name);
      }
      // An expert is a slice of a tensor the store holds whole (or of several): its source pages
      // are dropped like the others', but the store's tensors are not named as unread.
      if (layer.moe) {
        for (weight_view* w : layer.moe->matrices()) {
          dense.push_back(w);
          dense_names.emplace_back();
        }
      }
    }
    if (lm_head_.data != nullptr) {
      dense.push_back(&lm_head_);
      dense_names.push_back(names.lm_head);
    }
    repacked_ = cpu::repack_for_active_level(pool_, dense, [&](const weight_view& w) {
      if (w.data != embed_tokens_.data) cpu::release_source_pages(w);
    });
    for (size_t i = 0; i < dense.size(); ++i) {
      if (dense[i]->repacked != nullptr && dense[i]->data != embed_tokens_.data && !dense_names[i].empty()) {
        not_read_.push_back(dense_names[i]);
      }
    }
    // The matrices of types with no repacked layout move to huge pages as they are; a tied
    // embedding follows its lm_head to the copy.
    // An anonymous source moves only if the store can free it (a loader's owned copy, named
    // below); experts are slices of store tensors and are not named, so theirs stay.
    std::vector<bool> store_frees(dense.size(), false);
    for (size_t i = 0; i < dense.size(); ++i) {
      const weight_tensor* tensor = dense_names[i].empty() ? nullptr : weights.find(dense_names[i]);
      store_frees[i] = tensor != nullptr && tensor->owned_copy != nullptr && tensor->data == dense[i]->data;
    }
    const bool tied = lm_head_.data != nullptr && lm_head_.data == embed_tokens_.data;
    cpu::huge_page_copy copy = cpu::copy_weights_to_huge_pages(pool_, dense, store_frees);
    if (tied) embed_tokens_.data = lm_head_.data;
    for (size_t i : copy.from_anonymous) not_read_.push_back(dense_names[i]);
    huge_page_copies_ = std::move(copy.buffer);
  }

 public:
  const std::vector<std::string>& weights_not_read() const { return not_read_; }

 private:
  model_config config_;
  const architecture_traits& traits_;
  layer_range stage_;  // the layers this model holds (all but in a pipeline stage)
  cpu::thread_pool pool_;
  cpu::kv_pool kv_;                    // the stage's layers only, numbered from 0
  weight_view embed_tokens_;           // [vocab, hidden]; first stage only
  weight_view lm_head_;                // [vocab, hidden]; embed_tokens_ when tied; last stage only
  std::vector<float> final_norm_;      // [hidden]; last stage only
  std::vector<layer_weights> layers_;  // [stage_.count()]
  cpu::activation activation_;
  cpu::attention_params attention_params_;

  cpu::repacked_buffer repacked_;          // the repacked copies the views point at, one buffer
  cpu::repacked_buffer huge_page_copies_;  // the matrices not repacked, in huge pages (huge_page_weights.hpp)
  std::vector<std::string> not_read_;      // the store's tensors repacked_ replaces
  std::vector<float> x_, h_, out_, q_, k_, v_, attn_, gate_, up_, logits_hidden_;
  std::vector<float> scratch_;  // converted weight slabs for sgemm
  cpu::attention_workspace attention_workspace_;
  cpu::moe_workspace moe_workspace_;
};

}  // namespace

std::unique_ptr<model> make_cpu_model(const model_config& config, const weight_store& weights, kv_cache_shape kv_shape,
                                      int num_threads, dtype kv_dtype, layer_range layers) {
  return std::make_unique<cpu_model>(config, weights, kv_shape, num_threads, kv_dtype, layers);
}

std::vector<std::string> cpu_weights_not_read(const model& m) {
  const auto* cpu = dynamic_cast<const cpu_model*>(&m);
  return cpu == nullptr ? std::vector<std::string>{} : cpu->weights_not_read();
}

int cpu_kv_blocks_for_budget(const model_config& config, size_t bytes, int block_size, dtype kv_dtype,
                             layer_range layers) {
  if (block_size <= 0) {
    throw std::runtime_error("block_size must be positive, got " + std::to_string(block_size));
  }
  model_config c = config;
  if (c.head_dim == 0 && c.num_heads > 0) c.head_dim = c.hidden_size / c.num_heads;
  c.num_layers = layers.resolved(c.num_layers).count();  // a pipeline stage pools its layers only
  const size_t per_block = cpu::kv_pool::bytes_per_block(c, block_size, kv_dtype);
  if (per_block == 0) throw std::runtime_error("model config has an empty KV cache per block");
  return static_cast<int>(std::min<size_t>(bytes / per_block, INT32_MAX));
}

}  // namespace troupe
