#include "model/loader/gguf_model_loader.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <stdexcept>

#include "model/architecture.hpp"
#include "model/loader/float_conversion.hpp"
#include "model/loader/gguf_tensor_names.hpp"
#include "model/loader/rope_permutation.hpp"
#include "model/model_tensors.hpp"
#include "model/quant/dequantize.hpp"
#include "model/rope_frequencies.hpp"

namespace troupe {
namespace {

[[noreturn]] void fail(const gguf_file& file, const std::string& problem) {
  throw std::runtime_error("GGUF file '" + file.path().string() + "': " + problem);
}

int positive_int(const gguf_file& file, const std::string& key) {
  int64_t value = file.get_int(key);
  if (value <= 0 || value > (int64_t{1} << 30))
    fail(file, "'" + key + "' is " + std::to_string(value) + ", expected a positive integer");
  return static_cast<int>(value);
}

std::vector<float> f32_values(const gguf_file& file, const gguf_tensor_info& info, int64_t count) {
  if (info.type != static_cast<uint32_t>(gguf_tensor_type::f32) || info.dims.size() != 1 || info.dims[0] != count) {
    fail(file, "tensor '" + info.name + "' must be F32 with " + std::to_string(count) + " values");
  }
  std::vector<float> values(count);
  std::memcpy(values.data(), info.data, values.size() * 4);
  return values;
}

// Llama 3 GGUFs carry the scaling only as rope_freqs.weight. Troupe's model maker also writes
// the parameters (troupe.rope_scaling.*); for other files the usual Llama 3.x parameters are
// assumed and checked against the tensor, so a mismatch is an error, not a silent drift.
void read_llama3_scaling(const gguf_file& file, model_config& config) {
  const gguf_tensor_info* freqs = file.find_tensor("rope_freqs.weight");
  if (auto factor = file.find_float("troupe.rope_scaling.factor")) {
    rope_scaling_config scaling;
    scaling.type = rope_scaling_type::llama3;
    scaling.factor = static_cast<float>(*factor);
    scaling.low_freq_factor = static_cast<float>(file.get_float("troupe.rope_scaling.low_freq_factor"));
    scaling.high_freq_factor = static_cast<float>(file.get_float("troupe.rope_scaling.high_freq_factor"));
    scaling.original_max_position_embeddings =
        static_cast<int>(file.get_int("troupe.rope_scaling.original_max_position_embeddings"));
    config.rope_scaling = scaling;
    return;
  }
  if (!freqs) return;
  std::vector<float> stored = f32_values(file, *freqs, rotary_dims(config) / 2);
  rope_scaling_config scaling;
  scaling.type = rope_scaling_type::llama3;
  scaling.original_max_position_embeddings = 8192;
  for (float f : stored) scaling.factor = std::max(scaling.factor, f);
  config.rope_scaling = scaling;
  std::vector<float> expected = llama3_rope_factors(config);
  for (size_t i = 0; i < stored.size(); ++i) {
    if (std::fabs(expected[i] - stored[i]) > 1e-3f * std::fabs(expected[i])) {
      fail(file, "rope_freqs.weight does not match Llama 3 scaling with factor " + std::to_string(scaling.factor) +
                     ", low_freq_factor 1, high_freq_factor 4, original context 8192 (value " + std::to_string(i) +
                     ": " + std::to_string(stored[i]) + " vs " + std::to_string(expected[i]) + ")");
    }
  }
}

// rope.scaling.* keys (linear, yarn), Phi-3's rope_factors_long/short tensors (longrope), or
// Llama 3's rope_freqs.weight.
void read_rope_scaling(const gguf_file& file, const std::string& p, model_config& config) {
  const std::string type = file.find_string(p + "rope.scaling.type").value_or("none");
  const int original = file.find_int(p + "rope.scaling.original_context_length")
                           ? positive_int(file, p + "rope.scaling.original_context_length")
                           : config.max_position_embeddings;
  const float factor = static_cast<float>(file.find_float(p + "rope.scaling.factor").value_or(0.0));
  const gguf_tensor_info* long_factors = file.find_tensor("rope_factors_long.weight");
  if (long_factors) {
    const gguf_tensor_info* short_factors = file.find_tensor("rope_factors_short.weight");
    if (!short_factors) fail(file, "has rope_factors_long.weight but no rope_factors_short.weight");
    rope_scaling_config scaling;
    scaling.type = rope_scaling_type::longrope;
    scaling.original_max_position_embeddings = original;
    scaling.long_factor = f32_values(file, *long_factors, rotary_dims(config) / 2);
    scaling.short_factor = f32_values(file, *short_factors, rotary_dims(config) / 2);
    scaling.attention_factor =
        static_cast<float>(file.find_float(p + "rope.scaling.attn_factor")
                               .value_or(longrope_attention_factor(config.max_position_embeddings, original)));
    config.rope_scaling = scaling;
    return;
  }
  if (type == "none" || (type == "linear" && (factor == 0.0f || factor == 1.0f))) {
    read_llama3_scaling(file, config);
    return;
  }
  rope_scaling_config scaling;
  scaling.factor = factor;
  scaling.original_max_position_embeddings = original;
  if (type == "linear") {
    scaling.type = rope_scaling_type::linear;
  } else if (type == "yarn") {
    scaling.type = rope_scaling_type::yarn;
    scaling.beta_fast = static_cast<float>(file.find_float(p + "rope.scaling.yarn_beta_fast").value_or(32.0));
    scaling.beta_slow = static_cast<float>(file.find_float(p + "rope.scaling.yarn_beta_slow").value_or(1.0));
    if (auto log_mul = file.find_float(p + "rope.scaling.yarn_log_multiplier"); log_mul && *log_mul != 0) {
      scaling.mscale = 1.0f;
      scaling.mscale_all_dim = static_cast<float>(*log_mul);
    }
    // gpt-oss was trained with an untruncated correction range (its config.json says so);
    // GGUF has no key for it.
    scaling.truncate = config.arch != architecture::gpt_oss;
  } else {
    fail(file,
         "unsupported rope scaling type '" + type +
             "' (supported: none, linear, yarn, longrope through rope_factors_*, llama3 through rope_freqs.weight)");
  }
  if (!(scaling.factor > 0)) fail(file, "rope.scaling.factor must be positive for " + type + " scaling");
  config.rope_scaling = scaling;
}

// Which architecture a GGUF's general.architecture names. "llama" with experts is Mixtral.
architecture read_architecture(const gguf_file& file, const std::string& arch_name) {
  const std::optional<architecture> arch = architecture_from_gguf_name(arch_name);
  if (!arch) fail(file, "unsupported architecture '" + arch_name + "'; supported: " + architecture_gguf_names());
  if (*arch == architecture::llama && file.find_int(arch_name + ".expert_count").value_or(0) > 0)
    return architecture::mixtral;
  return *arch;
}

void read_moe(const gguf_file& file, const std::string& p, model_config& config) {
  if (!traits_of(config.arch).experts) return;
  moe_config& moe = config.moe;
  moe.num_experts = positive_int(file, p + "expert_count");
  moe.experts_per_token = positive_int(file, p + "expert_used_count");
  moe.expert_intermediate_size = file.find_int(p + "expert_feed_forward_length")
                                     ? positive_int(file, p + "expert_feed_forward_length")
                                     : config.intermediate_size;
  if (moe.experts_per_token > moe.num_experts) {
    fail(file, "expert_used_count " + std::to_string(moe.experts_per_token) + " exceeds expert_count " +
                   std::to_string(moe.num_experts));
  }
  // llama.cpp fixes the routing per architecture; so does Troupe for its files.
  switch (config.arch) {
    case architecture::mixtral:
    case architecture::qwen3_moe: moe.norm_topk_prob = true; break;
    case architecture::qwen2_moe:
      moe.norm_topk_prob = false;
      moe.shared_expert_intermediate_size = file.find_int(p + "expert_shared_feed_forward_length")
                                                ? positive_int(file, p + "expert_shared_feed_forward_length")
                                                : config.intermediate_size;
      break;
    case architecture::gpt_oss:
      moe.scoring = router_scoring::softmax_over_top_k;
      moe.router_bias = true;
      moe.expert_bias = true;
      break;
    default: break;
  }
  if (config.arch == architecture::mixtral || config.arch == architecture::gpt_oss)
    config.intermediate_size = moe.expert_intermediate_size;
}

// Sliding layers: the pattern key (a count or one flag per layer) or the family's default.
void read_sliding_window(const gguf_file& file, const std::string& p, model_config& config) {
  const architecture arch = config.arch;
  int window = file.find_int(p + "attention.sliding_window")
                   ? static_cast<int>(file.get_int(p + "attention.sliding_window"))
                   : 0;
  if (arch == architecture::gemma2 && window == 0) window = 4096;  // llama.cpp's default for Gemma 2
  if (window <= 0 || arch == architecture::phi3) return;           // llama.cpp runs Phi-3 without its window, as here
  config.sliding_window = window;
  config.sliding_layers.assign(config.num_layers, true);
  int pattern = arch == architecture::gemma2 || arch == architecture::gpt_oss ? 2
                : arch == architecture::gemma3                                ? 6
                                                                              : 1;
  if (const gguf_value* value = file.find(p + "attention.sliding_window_pattern")) {
    if (value->type == gguf_value_type::array) {
      const nlohmann::json& flags = file.get_array(p + "attention.sliding_window_pattern");
      if (static_cast<int>(flags.size()) != config.num_layers)
        fail(file, "sliding_window_pattern must have one flag per layer");
      for (int i = 0; i < config.num_layers; ++i) config.sliding_layers[i] = flags[i].get<bool>();
      return;
    }
    pattern = static_cast<int>(file.get_int(p + "attention.sliding_window_pattern"));
  }
  if (pattern > 1) {
    for (int i = 0; i < config.num_layers; ++i) config.sliding_layers[i] = i % pattern < pattern - 1;
  }
}

void read_gemma(const gguf_file& file, const std::string& p, model_config& config) {
  config.activation = activation_kind::gelu_tanh;
  // llama.cpp: 1/sqrt(head_dim), but hidden/heads for the 27B models (Gemma 2: 46 layers, Gemma 3: 62).
  const bool big = (config.arch == architecture::gemma2 && config.num_layers == 46) ||
                   (config.arch == architecture::gemma3 && config.num_layers == 62);
  config.query_pre_attn_scalar = static_cast<float>(big ? config.hidden_size / config.num_heads : config.head_dim);
  if (config.arch == architecture::gemma2) {
    config.attn_logit_softcapping = static_cast<float>(file.find_float(p + "attn_logit_softcapping").value_or(50.0));
    config.final_logit_softcapping = static_cast<float>(file.find_float(p + "final_logit_softcapping").value_or(30.0));
  } else {
    config.final_logit_softcapping = static_cast<float>(file.find_float(p + "final_logit_softcapping").value_or(0.0));
    config.rope_local_theta = static_cast<float>(file.find_float(p + "rope.freq_base_swa").value_or(10000.0));
  }
}

}  // namespace

std::vector<float> llama3_rope_factors(const model_config& config) {
  const rope_scaling_config scaling = config.rope_scaling.value_or(rope_scaling_config{});
  const int original = scaling.original_max_position_embeddings > 0 ? scaling.original_max_position_embeddings : 8192;
  const double low_wavelen = original / scaling.low_freq_factor;
  const double high_wavelen = original / scaling.high_freq_factor;
  const int dims = rotary_dims(config);
  std::vector<float> factors;
  for (int i = 0; i < dims; i += 2) {
    double freq = 1.0 / std::pow(static_cast<double>(config.rope_theta), static_cast<double>(i) / dims);
    double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      factors.push_back(scaling.factor);
    } else {
      double smooth =
          (original / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
      factors.push_back(static_cast<float>(1.0 / ((1 - smooth) / scaling.factor + smooth)));
    }
  }
  return factors;
}

model_config gguf_model_config(const gguf_file& file) {
  const std::string arch_name = file.get_string("general.architecture");
  model_config config;
  config.arch = read_architecture(file, arch_name);
  const architecture_traits& traits = traits_of(config.arch);
  config.architecture_name = std::string(traits.hf_name);
  config.attention_bias = traits.always_attention_bias;
  config.qk_norm = traits.always_qk_norm;
  config.attention_sinks = config.arch == architecture::gpt_oss;
  if (config.arch == architecture::gpt_oss) config.activation = activation_kind::swiglu_oai;
  const std::string p = arch_name + ".";
  config.hidden_size = positive_int(file, p + "embedding_length");
  config.intermediate_size =
      file.find_int(p + "feed_forward_length") ? positive_int(file, p + "feed_forward_length") : 0;
  config.num_layers = positive_int(file, p + "block_count");
  config.num_heads = positive_int(file, p + "attention.head_count");
  config.num_kv_heads = file.find_int(p + "attention.head_count_kv") ? positive_int(file, p + "attention.head_count_kv")
                                                                     : config.num_heads;
  config.head_dim = file.find_int(p + "attention.key_length") ? positive_int(file, p + "attention.key_length")
                                                              : config.hidden_size / config.num_heads;
  if (file.find_int(p + "rope.dimension_count")) {
    const int dims = positive_int(file, p + "rope.dimension_count");
    if (dims > config.head_dim || dims % 2 != 0) {
      fail(file, "rope.dimension_count " + std::to_string(dims) + " must be even and at most head_dim " +
                     std::to_string(config.head_dim));
    }
    if (dims != config.head_dim) config.rotary_dim = dims;
  }
  config.max_position_embeddings =
      file.find_int(p + "context_length") ? positive_int(file, p + "context_length") : 2048;
  config.rms_norm_eps = static_cast<float>(file.find_float(p + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  config.rope_theta = static_cast<float>(file.find_float(p + "rope.freq_base").value_or(10000.0));
  if (config.num_heads % config.num_kv_heads != 0) {
    fail(file, "head_count " + std::to_string(config.num_heads) + " is not a multiple of head_count_kv " +
                   std::to_string(config.num_kv_heads));
  }
  const gguf_tensor_info* embeddings = file.find_tensor("token_embd.weight");
  if (!embeddings) fail(file, "has no token_embd.weight tensor");
  if (auto vocab = file.find_int(p + "vocab_size")) {
    config.vocab_size = static_cast<int>(*vocab);
  } else if (file.find("tokenizer.ggml.tokens")) {
    config.vocab_size = static_cast<int>(file.get_array("tokenizer.ggml.tokens").size());
  } else {
    config.vocab_size = static_cast<int>(embeddings->shape().front());
  }
  config.tie_word_embeddings = file.find_tensor("output.weight") == nullptr;
  config.bos_token_id = static_cast<int>(file.find_int("tokenizer.ggml.bos_token_id").value_or(-1));
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (auto id = file.find_int(key)) {
      if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), *id) == config.eos_token_ids.end()) {
        config.eos_token_ids.push_back(static_cast<int>(*id));
      }
    }
  }
  read_moe(file, p, config);
  if (config.intermediate_size <= 0) fail(file, "'" + p + "feed_forward_length' is missing");
  if (config.arch == architecture::gemma2 || config.arch == architecture::gemma3) read_gemma(file, p, config);
  read_rope_scaling(file, p, config);
  read_sliding_window(file, p, config);
  return config;
}

namespace {

// The canonical tensors one GGUF tensor holds: row slices of its mapped data (or of an owned,
// un-permuted or shifted copy).
void add_parts(const gguf_file& file, const gguf_tensor_layout& layout, const gguf_tensor_info& info,
               const std::map<std::string, std::vector<int64_t>>& shapes, weight_store& store) {
  weight_tensor whole = file.view(info, layout.gguf_name);
  int64_t expected = 1;
  for (int64_t d : layout.shape) expected *= d;
  if (whole.num_elements() != expected || whole.shape.back() != layout.shape.back()) {
    fail(file, "tensor '" + info.name + "' has shape " + shape_string(whole.shape) + ", expected " +
                   shape_string(layout.shape));
  }
  if (auto bad = quant::first_bad_scale_block(whole.type, whole.data, whole.num_elements())) {
    fail(file, "tensor '" + info.name + "' (" + std::string(dtype_name(whole.type)) +
                   ") has a NaN or infinite scale in block " + std::to_string(*bad));
  }
  const std::byte* data = whole.data;
  std::shared_ptr<const void> owned_copy;  // set when the parts' bytes are this copy
  const size_t row_size = row_bytes(whole.type, whole.shape.back());
  if (layout.permuted_heads > 0) {
    const int64_t rows = whole.num_elements() / whole.shape.back();
    auto buffer = std::make_shared<std::vector<std::byte>>(whole.num_bytes);
    permute_rows_gguf_to_hf(data, buffer->data(), rows, row_size, layout.permuted_heads);
    // The mapped bytes are never read again (the store holds the copy): without this, the q and k
    // matrices of a Llama GGUF stayed resident twice (60 MB of a 1.1 B Q4_0 model, measured).
    file.mapping()->release_pages(data, whole.num_bytes);
    data = buffer->data();
    owned_copy = buffer;  // held by the parts, so a backend that repacks them can free it
  }
  if (layout.norm_plus_one) {  // Gemma: llama.cpp's converter stored 1 + w; canonical is w
    std::vector<float> values(whole.num_elements());
    convert_to_f32(data, whole.type, values);
    auto buffer = std::make_shared<std::vector<std::byte>>(values.size() * sizeof(float));
    for (float& v : values) v -= 1.0f;  // exact for stored values in [0.5, 2]
    std::memcpy(buffer->data(), values.data(), buffer->size());
    whole.type = dtype::f32;
    data = buffer->data();
    store.keep_alive(buffer);
  }
  size_t offset = 0;
  for (const std::string& name : layout.parts) {
    const std::vector<int64_t>& shape = shapes.at(name);
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    weight_tensor part;
    part.name = name;
    part.type = whole.type;
    part.shape = shape;
    part.data = data + offset;
    part.num_bytes = row_bytes(whole.type, count);
    part.owned_copy = owned_copy;
    offset += part.num_bytes;
    store.add(std::move(part));
  }
}

}  // namespace

void load_gguf_weights(const gguf_file& file, const model_config& config, weight_store& store) {
  store.keep_alive(file.mapping());
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const tensor_spec& spec : expected_tensors(config)) shapes[spec.name] = spec.shape;
  for (const gguf_tensor_layout& layout : gguf_tensor_layouts(config)) {
    const gguf_tensor_info* info = file.find_tensor(layout.gguf_name);
    if (!info) fail(file, "tensor '" + layout.gguf_name + "' is missing; expected shape " + shape_string(layout.shape));
    add_parts(file, layout, *info, shapes, store);
  }
}

}  // namespace troupe
