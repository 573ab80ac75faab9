#include "model/loader/gguf_model_loader.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <stdexcept>

#include "model/loader/float_conversion.hpp"
#include "model/loader/gguf_tensor_names.hpp"
#include "model/loader/rope_permutation.hpp"
#include "model/quant/dequantize.hpp"

namespace troupe {
namespace {

[[noreturn]] void fail(const gguf_file& file, const std::string& problem) {
  throw std::runtime_error("GGUF file '" + file.path().string() + "': " + problem);
}

int positive_int(const gguf_file& file, const std::string& key) {
  int64_t value = file.get_int(key);
  if (value <= 0 || value > (int64_t{1} << 30)) fail(file, "'" + key + "' is " + std::to_string(value) + ", expected a positive integer");
  return static_cast<int>(value);
}

// Llama 3 GGUFs carry the scaling only as rope_freqs.weight. Troupe's model maker also writes
// the parameters (troupe.rope_scaling.*); for other files the usual Llama 3.x parameters are
// assumed and checked against the tensor, so a mismatch is an error, not a silent drift.
void read_rope_scaling(const gguf_file& file, model_config& config) {
  const std::string arch = file.get_string("general.architecture");
  if (auto type = file.find_string(arch + ".rope.scaling.type"); type && *type != "none") {
    fail(file, "unsupported rope scaling type '" + *type + "' (supported: llama3 through rope_freqs.weight, or none)");
  }
  const gguf_tensor_info* freqs = file.find_tensor("rope_freqs.weight");
  if (auto factor = file.find_float("troupe.rope_scaling.factor")) {
    rope_scaling_config scaling;
    scaling.factor = static_cast<float>(*factor);
    scaling.low_freq_factor = static_cast<float>(file.get_float("troupe.rope_scaling.low_freq_factor"));
    scaling.high_freq_factor = static_cast<float>(file.get_float("troupe.rope_scaling.high_freq_factor"));
    scaling.original_max_position_embeddings = static_cast<int>(file.get_int("troupe.rope_scaling.original_max_position_embeddings"));
    config.rope_scaling = scaling;
    return;
  }
  if (!freqs) return;
  if (freqs->type != static_cast<uint32_t>(gguf_tensor_type::f32) || freqs->dims[0] != config.head_dim / 2) {
    fail(file, "rope_freqs.weight must be F32 with head_dim/2 values");
  }
  std::vector<float> stored(config.head_dim / 2);
  std::memcpy(stored.data(), freqs->data, stored.size() * 4);
  rope_scaling_config scaling;
  scaling.factor = 1.0f;
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

}  // namespace

std::vector<float> llama3_rope_factors(const model_config& config) {
  const rope_scaling_config scaling = config.rope_scaling.value_or(rope_scaling_config{});
  const double low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor;
  const double high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor;
  std::vector<float> factors;
  for (int i = 0; i < config.head_dim; i += 2) {
    double freq = 1.0 / std::pow(static_cast<double>(config.rope_theta), static_cast<double>(i) / config.head_dim);
    double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      factors.push_back(scaling.factor);
    } else {
      double smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) /
                      (scaling.high_freq_factor - scaling.low_freq_factor);
      factors.push_back(static_cast<float>(1.0 / ((1 - smooth) / scaling.factor + smooth)));
    }
  }
  return factors;
}

model_config gguf_model_config(const gguf_file& file) {
  const std::string arch = file.get_string("general.architecture");
  model_config config;
  if (arch == "llama") {
    config.arch = architecture::llama;
    config.architecture_name = "LlamaForCausalLM";
  } else if (arch == "qwen2") {
    config.arch = architecture::qwen2;
    config.architecture_name = "Qwen2ForCausalLM";
    config.attention_bias = true;
  } else if (arch == "qwen3") {
    config.arch = architecture::qwen3;
    config.architecture_name = "Qwen3ForCausalLM";
    config.qk_norm = true;
  } else {
    fail(file, "unsupported architecture '" + arch + "'; supported: llama, qwen2, qwen3");
  }
  const std::string p = arch + ".";
  config.hidden_size = positive_int(file, p + "embedding_length");
  config.intermediate_size = positive_int(file, p + "feed_forward_length");
  config.num_layers = positive_int(file, p + "block_count");
  config.num_heads = positive_int(file, p + "attention.head_count");
  config.num_kv_heads = file.find_int(p + "attention.head_count_kv") ? positive_int(file, p + "attention.head_count_kv") : config.num_heads;
  config.head_dim = file.find_int(p + "attention.key_length") ? positive_int(file, p + "attention.key_length")
                                                              : config.hidden_size / config.num_heads;
  config.max_position_embeddings = file.find_int(p + "context_length") ? positive_int(file, p + "context_length") : 2048;
  config.rms_norm_eps = static_cast<float>(file.find_float(p + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  config.rope_theta = static_cast<float>(file.find_float(p + "rope.freq_base").value_or(10000.0));
  if (config.num_heads % config.num_kv_heads != 0) {
    fail(file, "head_count " + std::to_string(config.num_heads) + " is not a multiple of head_count_kv " + std::to_string(config.num_kv_heads));
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
  read_rope_scaling(file, config);
  return config;
}

void load_gguf_weights(const gguf_file& file, const model_config& config, weight_store& store) {
  store.keep_alive(file.mapping());
  const bool permuted = file.get_string("general.architecture") == "llama";
  for (const auto& info : file.tensors()) {
    std::optional<std::string> name = hf_name_from_gguf(info.name);
    if (!name) continue;  // rope_freqs.weight and the like: folded into model_config
    weight_tensor tensor = file.view(info, *name);
    if (auto bad = quant::first_bad_scale_block(tensor.type, tensor.data, tensor.num_elements())) {
      fail(file, "tensor '" + info.name + "' (" + std::string(dtype_name(tensor.type)) + ") has a NaN or infinite scale in block " +
                     std::to_string(*bad));
    }
    const bool is_q = name->find(".self_attn.q_proj.") != std::string::npos;
    const bool is_k = name->find(".self_attn.k_proj.") != std::string::npos;
    if (permuted && (is_q || is_k)) {
      const int heads = is_q ? config.num_heads : config.num_kv_heads;
      const int64_t rows = tensor.shape.front();
      if (rows != int64_t{heads} * config.head_dim) {
        fail(file, "tensor '" + info.name + "' has " + std::to_string(rows) + " rows, expected " +
                       std::to_string(int64_t{heads} * config.head_dim));
      }
      auto buffer = std::make_shared<std::vector<std::byte>>(tensor.num_bytes);
      permute_rows_gguf_to_hf(tensor.data, buffer->data(), rows, tensor.num_bytes / rows, heads);
      tensor.data = buffer->data();
      store.keep_alive(buffer);
    }
    store.add(std::move(tensor));
  }
}

}  // namespace troupe
