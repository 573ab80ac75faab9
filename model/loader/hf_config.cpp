#include "model/loader/hf_config.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "model/architecture.hpp"
#include "model/rope_frequencies.hpp"

namespace troupe {
namespace {

[[noreturn]] void fail(const std::string& problem) { throw std::runtime_error("config.json: " + problem); }

int required_int(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || !it->is_number_integer()) fail(std::string("missing or non-integer '") + key + "'");
  int64_t value = it->get<int64_t>();
  if (value <= 0 || value > (int64_t{1} << 30)) {
    fail(std::string("'") + key + "' is " + std::to_string(value) + ", expected a positive integer");
  }
  return static_cast<int>(value);
}

// An optional positive integer, range-checked before it is narrowed (a context of 0, -5 or 1e12
// was taken as 4096, issue 25).
int optional_int(const nlohmann::json& config, const char* key, int fallback) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  return required_int(config, key);
}

// An optional finite number in (low, high): rope_theta 0 or rms_norm_eps -1 loaded and made
// token 0 forever.
float optional_number(const nlohmann::json& config, const char* key, float fallback, double low, double high) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_number()) fail(std::string("'") + key + "' must be a number");
  const double value = it->get<double>();
  if (!(value > low && value < high)) {
    std::ostringstream text;
    text << "'" << key << "' is " << value << ", expected a number above " << low << " and below " << high;
    fail(text.str());
  }
  return static_cast<float>(value);
}

bool has(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  return it != config.end() && !it->is_null();
}

template <typename T>
T value_or(const nlohmann::json& config, const char* key, T fallback) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  return it->get<T>();
}

void append_ids(const nlohmann::json& value, std::vector<int>& ids) {
  auto add = [&](const nlohmann::json& id) {
    if (!id.is_number_integer()) throw std::runtime_error("eos_token_id must be an integer or a list of integers");
    int v = id.get<int>();
    if (std::find(ids.begin(), ids.end(), v) == ids.end()) ids.push_back(v);
  };
  if (value.is_null()) return;
  if (value.is_array()) {
    for (const auto& id : value) add(id);
  } else {
    add(value);
  }
}

std::vector<float> float_list(const nlohmann::json& scaling, const char* key) {
  auto it = scaling.find(key);
  if (it == scaling.end() || !it->is_array()) fail(std::string("longrope rope_scaling needs a list '") + key + "'");
  std::vector<float> values;
  for (const auto& v : *it) {
    if (!v.is_number() || v.get<double>() <= 0)
      fail(std::string("rope_scaling '") + key + "' must hold positive numbers");
    values.push_back(v.get<float>());
  }
  return values;
}

// `config` carries max_position_embeddings (the checkpoint's) and, for Phi-3, a top-level
// original_max_position_embeddings.
std::optional<rope_scaling_config> parse_rope_scaling(const nlohmann::json& config, const model_config& parsed) {
  auto it = config.find("rope_scaling");
  if (it == config.end() || it->is_null()) return std::nullopt;
  const nlohmann::json& scaling = *it;
  if (!scaling.is_object()) fail("'rope_scaling' must be an object or null");
  const std::string type = value_or<std::string>(scaling, "rope_type", value_or<std::string>(scaling, "type", ""));
  if (type == "default") return std::nullopt;
  rope_scaling_config result;
  result.factor = value_or<float>(scaling, "factor", 1.0f);
  result.original_max_position_embeddings = value_or<int>(scaling, "original_max_position_embeddings",
                                                          value_or<int>(config, "original_max_position_embeddings", 0));
  if (type == "linear") {
    result.type = rope_scaling_type::linear;
  } else if (type == "dynamic") {
    result.type = rope_scaling_type::dynamic;
  } else if (type == "llama3") {
    result.type = rope_scaling_type::llama3;
    result.low_freq_factor = value_or<float>(scaling, "low_freq_factor", result.low_freq_factor);
    result.high_freq_factor = value_or<float>(scaling, "high_freq_factor", result.high_freq_factor);
    if (result.original_max_position_embeddings == 0) result.original_max_position_embeddings = 8192;
    if (result.low_freq_factor <= 0 || result.high_freq_factor <= result.low_freq_factor) {
      fail("llama3 rope_scaling needs high_freq_factor > low_freq_factor > 0");
    }
  } else if (type == "yarn") {
    result.type = rope_scaling_type::yarn;
    result.beta_fast = value_or<float>(scaling, "beta_fast", result.beta_fast);
    result.beta_slow = value_or<float>(scaling, "beta_slow", result.beta_slow);
    result.mscale = value_or<float>(scaling, "mscale", 0.0f);
    result.mscale_all_dim = value_or<float>(scaling, "mscale_all_dim", 0.0f);
    result.truncate = value_or<bool>(scaling, "truncate", true);
    result.attention_factor = value_or<float>(scaling, "attention_factor", 0.0f);
  } else if (type == "longrope" || type == "su") {
    result.type = rope_scaling_type::longrope;
    result.short_factor = float_list(scaling, "short_factor");
    result.long_factor = float_list(scaling, "long_factor");
    // transformers (and llama.cpp's converter) take the default attention factor from the
    // checkpoint's context against the original one; fixed here, before a served context may
    // lower max_position_embeddings.
    if (result.original_max_position_embeddings == 0)
      result.original_max_position_embeddings = parsed.max_position_embeddings;
    result.attention_factor = value_or<float>(
        scaling, "attention_factor",
        longrope_attention_factor(parsed.max_position_embeddings, result.original_max_position_embeddings));
  } else {
    fail("unsupported rope_scaling type '" + type +
         "' (supported: linear, dynamic, llama3, yarn, longrope, su, or none)");
  }
  if (!(result.factor > 0)) fail("rope_scaling factor must be positive");
  if (result.original_max_position_embeddings == 0)
    result.original_max_position_embeddings = parsed.max_position_embeddings;
  return result;
}

// The activation a config names must be the one its architecture is built with.
activation_kind parse_activation(const nlohmann::json& config, architecture arch) {
  const std::string act =
      value_or<std::string>(config, "hidden_activation", value_or<std::string>(config, "hidden_act", ""));
  switch (arch) {
    case architecture::gemma2:
    case architecture::gemma3:
      if (!act.empty() && act != "gelu_pytorch_tanh" && act != "gelu_tanh") {
        fail("hidden_activation '" + act + "' is not supported for Gemma (expected gelu_pytorch_tanh)");
      }
      return activation_kind::gelu_tanh;
    case architecture::gpt_oss: return activation_kind::swiglu_oai;
    default:
      if (!act.empty() && act != "silu" && act != "swish")
        fail("hidden_act '" + act + "' is not supported (expected silu)");
      return activation_kind::silu;
  }
}

// Which layers attend to a sliding window: "layer_types" when given, else the family's pattern.
void parse_sliding_window(const nlohmann::json& config, model_config& result) {
  const architecture arch = result.arch;
  bool window_applies = false;
  switch (arch) {
    case architecture::mistral:
    case architecture::mixtral:
    case architecture::phi3: window_applies = true; break;
    case architecture::qwen2:
    case architecture::qwen3:
    case architecture::qwen2_moe:
    case architecture::qwen3_moe: window_applies = value_or<bool>(config, "use_sliding_window", false); break;
    case architecture::gemma2:
    case architecture::gemma3:
    case architecture::gpt_oss: window_applies = true; break;
    case architecture::llama: break;
  }
  if (!window_applies || !has(config, "sliding_window")) return;
  result.sliding_window = required_int(config, "sliding_window");
  result.sliding_layers.assign(result.num_layers, true);
  if (has(config, "layer_types")) {
    const auto& types = config["layer_types"];
    if (!types.is_array() || static_cast<int>(types.size()) != result.num_layers) {
      fail("'layer_types' must list one type per layer (" + std::to_string(result.num_layers) + ")");
    }
    for (int i = 0; i < result.num_layers; ++i) {
      const std::string type = types[i].is_string() ? types[i].get<std::string>() : "";
      if (type != "sliding_attention" && type != "full_attention") {
        fail("layer_types[" + std::to_string(i) + "] is '" + type + "', expected sliding_attention or full_attention");
      }
      result.sliding_layers[i] = type == "sliding_attention";
    }
    return;
  }
  // Gemma 2 and gpt-oss alternate from a sliding first layer; Gemma 3 has one full layer in
  // sliding_window_pattern (6); the others slide everywhere.
  int pattern = 1;
  if (arch == architecture::gemma2 || arch == architecture::gpt_oss) pattern = 2;
  if (arch == architecture::gemma3) pattern = value_or<int>(config, "sliding_window_pattern", 6);
  if (pattern > 1) {
    for (int i = 0; i < result.num_layers; ++i) result.sliding_layers[i] = (i + 1) % pattern != 0;
  }
}

void parse_moe(const nlohmann::json& config, model_config& result) {
  moe_config& moe = result.moe;
  switch (result.arch) {
    case architecture::mixtral:
      moe.num_experts = required_int(config, "num_local_experts");
      moe.experts_per_token = required_int(config, "num_experts_per_tok");
      moe.expert_intermediate_size = result.intermediate_size;
      moe.norm_topk_prob = true;  // MixtralSparseMoeBlock always renormalises
      break;
    case architecture::qwen2_moe:
    case architecture::qwen3_moe:
      moe.num_experts = required_int(config, "num_experts");
      moe.experts_per_token = required_int(config, "num_experts_per_tok");
      moe.expert_intermediate_size = required_int(config, "moe_intermediate_size");
      moe.norm_topk_prob = value_or<bool>(config, "norm_topk_prob", false);
      if (result.arch == architecture::qwen2_moe) {
        moe.shared_expert_intermediate_size = required_int(config, "shared_expert_intermediate_size");
      }
      // Dense layers among sparse ones: no released checkpoint has them, nor does GGUF say so.
      if (value_or<int>(config, "decoder_sparse_step", 1) != 1)
        fail("decoder_sparse_step other than 1 is not supported");
      if (has(config, "mlp_only_layers") && !config["mlp_only_layers"].empty())
        fail("mlp_only_layers is not supported (expected [])");
      break;
    case architecture::gpt_oss:
      moe.num_experts = required_int(config, "num_local_experts");
      moe.experts_per_token = has(config, "num_experts_per_tok") ? required_int(config, "num_experts_per_tok")
                                                                 : required_int(config, "experts_per_token");
      moe.expert_intermediate_size = result.intermediate_size;
      moe.scoring = router_scoring::softmax_over_top_k;
      moe.router_bias = true;
      moe.expert_bias = true;
      result.swiglu_limit = value_or<float>(config, "swiglu_limit", 7.0f);
      break;
    default: return;
  }
  if (moe.experts_per_token > moe.num_experts) {
    fail("num_experts_per_tok " + std::to_string(moe.experts_per_token) + " exceeds the " +
         std::to_string(moe.num_experts) + " experts");
  }
}

void parse_gemma(const nlohmann::json& config, model_config& result) {
  result.query_pre_attn_scalar = value_or<float>(config, "query_pre_attn_scalar", static_cast<float>(result.head_dim));
  result.final_logit_softcapping = value_or<float>(config, "final_logit_softcapping", 0.0f);
  result.attn_logit_softcapping = value_or<float>(config, "attn_logit_softcapping", 0.0f);
  if (result.arch == architecture::gemma3)
    result.rope_local_theta = value_or<float>(config, "rope_local_base_freq", 10000.0f);
  // Gemma ties its embeddings unless the config says otherwise.
  result.tie_word_embeddings = value_or<bool>(config, "tie_word_embeddings", true);
}

}  // namespace

model_config parse_hf_config(const nlohmann::json& config, const nlohmann::json& generation_config) {
  if (!config.is_object()) fail("expected a JSON object");
  std::string name;
  if (auto it = config.find("architectures"); it != config.end() && it->is_array() && !it->empty()) {
    name = (*it)[0].get<std::string>();
  }
  const std::optional<architecture> arch = architecture_from_hf_name(name);
  if (!arch) {
    std::string shown = name.empty() ? "(none: 'architectures' is missing)" : "'" + name + "'";
    fail("unsupported architecture " + shown + "; supported: " + architecture_hf_names());
  }
  model_config result;
  result.arch = *arch;
  result.architecture_name = name;
  result.hidden_size = required_int(config, "hidden_size");
  result.intermediate_size = required_int(config, "intermediate_size");
  result.num_layers = required_int(config, "num_hidden_layers");
  result.num_heads = required_int(config, "num_attention_heads");
  result.num_kv_heads =
      has(config, "num_key_value_heads") ? required_int(config, "num_key_value_heads") : result.num_heads;
  result.vocab_size = required_int(config, "vocab_size");
  if (has(config, "head_dim")) {
    result.head_dim = required_int(config, "head_dim");
  } else {
    if (result.hidden_size % result.num_heads != 0) {
      fail("hidden_size " + std::to_string(result.hidden_size) + " is not a multiple of num_attention_heads " +
           std::to_string(result.num_heads) + " and no head_dim is given");
    }
    result.head_dim = result.hidden_size / result.num_heads;
  }
  if (result.num_heads % result.num_kv_heads != 0) {
    fail("num_attention_heads " + std::to_string(result.num_heads) + " is not a multiple of num_key_value_heads " +
         std::to_string(result.num_kv_heads));
  }
  if (has(config, "partial_rotary_factor")) {
    const double factor = config["partial_rotary_factor"].get<double>();
    const int dims = static_cast<int>(result.head_dim * factor);
    if (!(factor > 0 && factor <= 1) || dims % 2 != 0 || dims == 0) {
      fail("partial_rotary_factor " + std::to_string(factor) +
           " does not give an even number of rotary dimensions of head_dim " + std::to_string(result.head_dim));
    }
    if (dims != result.head_dim) result.rotary_dim = dims;
  }
  result.max_position_embeddings = optional_int(config, "max_position_embeddings", 2048);
  result.rms_norm_eps = optional_number(config, "rms_norm_eps", 1e-6f, 0, 1);
  result.rope_theta = optional_number(config, "rope_theta", 10000.0f, 0, 3.4e38);
  result.rope_scaling = parse_rope_scaling(config, result);
  result.activation = parse_activation(config, result.arch);
  const architecture_traits& traits = traits_of(result.arch);
  // Qwen2 has q/k/v biases whatever the file says; others follow "attention_bias".
  result.attention_bias = traits.always_attention_bias || value_or<bool>(config, "attention_bias", false);
  result.qk_norm = traits.always_qk_norm;
  result.tie_word_embeddings = value_or<bool>(config, "tie_word_embeddings", false);
  result.attention_sinks = result.arch == architecture::gpt_oss;
  if (result.arch == architecture::gemma2 || result.arch == architecture::gemma3) parse_gemma(config, result);
  parse_moe(config, result);
  parse_sliding_window(config, result);
  result.bos_token_id = value_or<int>(config, "bos_token_id", -1);
  if (config.contains("eos_token_id")) append_ids(config["eos_token_id"], result.eos_token_ids);
  if (generation_config.is_object()) {
    if (generation_config.contains("eos_token_id")) append_ids(generation_config["eos_token_id"], result.eos_token_ids);
    if (result.bos_token_id < 0) result.bos_token_id = value_or<int>(generation_config, "bos_token_id", -1);
  }
  return result;
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open '" + path.string() + "'");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("'" + path.string() + "' is not valid JSON: " + e.what());
  }
}

model_config load_hf_config(const std::filesystem::path& path) {
  std::filesystem::path config_path = std::filesystem::is_directory(path) ? path / "config.json" : path;
  if (!std::filesystem::exists(config_path)) {
    throw std::runtime_error("no config.json at '" + config_path.string() + "'");
  }
  nlohmann::json generation = nullptr;
  std::filesystem::path generation_path = config_path.parent_path() / "generation_config.json";
  if (std::filesystem::exists(generation_path)) generation = read_json_file(generation_path);
  try {
    return parse_hf_config(read_json_file(config_path), generation);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("'" + config_path.string() + "': " + e.what());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("'" + config_path.string() + "': " + e.what());
  }
}

namespace {

nlohmann::json rope_scaling_json(const rope_scaling_config& s) {
  nlohmann::json j;
  j["factor"] = s.factor;
  if (s.original_max_position_embeddings > 0)
    j["original_max_position_embeddings"] = s.original_max_position_embeddings;
  switch (s.type) {
    case rope_scaling_type::linear: j["rope_type"] = "linear"; break;
    case rope_scaling_type::dynamic: j["rope_type"] = "dynamic"; break;
    case rope_scaling_type::llama3:
      j["rope_type"] = "llama3";
      j["low_freq_factor"] = s.low_freq_factor;
      j["high_freq_factor"] = s.high_freq_factor;
      break;
    case rope_scaling_type::yarn:
      j["rope_type"] = "yarn";
      j["beta_fast"] = s.beta_fast;
      j["beta_slow"] = s.beta_slow;
      if (!s.truncate) j["truncate"] = false;
      if (s.mscale > 0) j["mscale"] = s.mscale;
      if (s.mscale_all_dim > 0) j["mscale_all_dim"] = s.mscale_all_dim;
      if (s.attention_factor > 0) j["attention_factor"] = s.attention_factor;
      break;
    case rope_scaling_type::longrope:
      j["rope_type"] = "longrope";
      j["short_factor"] = s.short_factor;
      j["long_factor"] = s.long_factor;
      // Phi-3 keeps the original context at the top level; the attention factor follows from it.
      j.erase("original_max_position_embeddings");
      break;
  }
  return j;
}

}  // namespace

nlohmann::json to_hf_config(const model_config& config) {
  const architecture_traits& traits = traits_of(config.arch);
  nlohmann::json j;
  j["architectures"] = {config.architecture_name.empty() ? std::string(traits.hf_name) : config.architecture_name};
  j["model_type"] = traits.hf_model_type;
  j["hidden_size"] = config.hidden_size;
  j["intermediate_size"] = config.intermediate_size;
  j["num_hidden_layers"] = config.num_layers;
  j["num_attention_heads"] = config.num_heads;
  j["num_key_value_heads"] = config.num_kv_heads;
  j["head_dim"] = config.head_dim;
  j["vocab_size"] = config.vocab_size;
  j["max_position_embeddings"] = config.max_position_embeddings;
  j["rms_norm_eps"] = config.rms_norm_eps;
  j["rope_theta"] = config.rope_theta;
  if (config.rotary_dim > 0) j["partial_rotary_factor"] = static_cast<double>(config.rotary_dim) / config.head_dim;
  switch (config.activation) {
    case activation_kind::silu: j["hidden_act"] = "silu"; break;
    case activation_kind::gelu_tanh:
      j["hidden_act"] = "gelu_pytorch_tanh";
      j["hidden_activation"] = "gelu_pytorch_tanh";
      break;
    case activation_kind::swiglu_oai: j["hidden_act"] = "silu"; break;
  }
  j["tie_word_embeddings"] = config.tie_word_embeddings;
  j["attention_bias"] = config.attention_bias;
  j["rope_scaling"] = config.rope_scaling ? rope_scaling_json(*config.rope_scaling) : nlohmann::json(nullptr);
  if (config.rope_scaling && config.rope_scaling->type == rope_scaling_type::longrope) {
    j["original_max_position_embeddings"] = config.rope_scaling->original_max_position_embeddings;
  }
  const moe_config& moe = config.moe;
  switch (config.arch) {
    case architecture::mixtral:
      j["num_local_experts"] = moe.num_experts;
      j["num_experts_per_tok"] = moe.experts_per_token;
      break;
    case architecture::qwen2_moe:
    case architecture::qwen3_moe:
      j["num_experts"] = moe.num_experts;
      j["num_experts_per_tok"] = moe.experts_per_token;
      j["moe_intermediate_size"] = moe.expert_intermediate_size;
      j["norm_topk_prob"] = moe.norm_topk_prob;
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = nlohmann::json::array();
      if (config.arch == architecture::qwen2_moe)
        j["shared_expert_intermediate_size"] = moe.shared_expert_intermediate_size;
      break;
    case architecture::gpt_oss:
      j["num_local_experts"] = moe.num_experts;
      j["num_experts_per_tok"] = moe.experts_per_token;
      j["experts_per_token"] = moe.experts_per_token;
      j["swiglu_limit"] = config.swiglu_limit;
      break;
    case architecture::gemma2:
    case architecture::gemma3:
      j["query_pre_attn_scalar"] = config.query_pre_attn_scalar;
      j["final_logit_softcapping"] =
          config.final_logit_softcapping > 0 ? nlohmann::json(config.final_logit_softcapping) : nlohmann::json(nullptr);
      j["attn_logit_softcapping"] =
          config.attn_logit_softcapping > 0 ? nlohmann::json(config.attn_logit_softcapping) : nlohmann::json(nullptr);
      if (config.arch == architecture::gemma3) j["rope_local_base_freq"] = config.rope_local_theta;
      break;
    default: break;
  }
  if (config.sliding_window > 0) {
    j["sliding_window"] = config.sliding_window;
    if (config.arch == architecture::qwen2 || config.arch == architecture::qwen3 ||
        config.arch == architecture::qwen2_moe || config.arch == architecture::qwen3_moe) {
      j["use_sliding_window"] = true;
    }
    nlohmann::json types = nlohmann::json::array();
    for (bool sliding : config.sliding_layers) types.push_back(sliding ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  } else {
    j["sliding_window"] = nullptr;
  }
  if (config.bos_token_id >= 0) j["bos_token_id"] = config.bos_token_id;
  if (config.eos_token_ids.size() == 1) {
    j["eos_token_id"] = config.eos_token_ids[0];
  } else if (!config.eos_token_ids.empty()) {
    j["eos_token_id"] = config.eos_token_ids;
  }
  j["torch_dtype"] = "float32";
  return j;
}

}  // namespace troupe
