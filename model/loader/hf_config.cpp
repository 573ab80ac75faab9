#include "model/loader/hf_config.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace troupe {
namespace {

struct known_architecture {
  const char* hf_name;
  architecture arch;
};

constexpr known_architecture known_architectures[] = {
    {"LlamaForCausalLM", architecture::llama},
    {"MistralForCausalLM", architecture::mistral},
    {"Qwen2ForCausalLM", architecture::qwen2},
    {"Qwen3ForCausalLM", architecture::qwen3},
};

std::string supported_list() {
  std::string list;
  for (const auto& known : known_architectures) {
    if (!list.empty()) list += ", ";
    list += known.hf_name;
  }
  return list;
}

int required_int(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || !it->is_number_integer()) {
    throw std::runtime_error(std::string("config.json: missing or non-integer '") + key + "'");
  }
  int64_t value = it->get<int64_t>();
  if (value <= 0 || value > (int64_t{1} << 30)) {
    throw std::runtime_error(std::string("config.json: '") + key + "' is " + std::to_string(value) +
                             ", expected a positive integer");
  }
  return static_cast<int>(value);
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

std::optional<rope_scaling_config> parse_rope_scaling(const nlohmann::json& config) {
  auto it = config.find("rope_scaling");
  if (it == config.end() || it->is_null()) return std::nullopt;
  const nlohmann::json& scaling = *it;
  if (!scaling.is_object()) throw std::runtime_error("config.json: 'rope_scaling' must be an object or null");
  std::string type = value_or<std::string>(scaling, "rope_type", value_or<std::string>(scaling, "type", ""));
  if (type == "default") return std::nullopt;
  if (type != "llama3") {
    throw std::runtime_error("config.json: unsupported rope_scaling type '" + type +
                             "' (supported: llama3, or none)");
  }
  rope_scaling_config result;
  result.factor = value_or<float>(scaling, "factor", result.factor);
  result.low_freq_factor = value_or<float>(scaling, "low_freq_factor", result.low_freq_factor);
  result.high_freq_factor = value_or<float>(scaling, "high_freq_factor", result.high_freq_factor);
  result.original_max_position_embeddings =
      value_or<int>(scaling, "original_max_position_embeddings", result.original_max_position_embeddings);
  if (result.factor <= 0 || result.low_freq_factor <= 0 || result.high_freq_factor <= result.low_freq_factor) {
    throw std::runtime_error("config.json: llama3 rope_scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0");
  }
  return result;
}

}  // namespace

model_config parse_hf_config(const nlohmann::json& config, const nlohmann::json& generation_config) {
  if (!config.is_object()) throw std::runtime_error("config.json: expected a JSON object");
  std::string name;
  if (auto it = config.find("architectures"); it != config.end() && it->is_array() && !it->empty()) {
    name = (*it)[0].get<std::string>();
  }
  model_config result;
  const known_architecture* found = nullptr;
  for (const auto& known : known_architectures) {
    if (name == known.hf_name) found = &known;
  }
  if (!found) {
    std::string shown = name.empty() ? "(none: 'architectures' is missing)" : "'" + name + "'";
    throw std::runtime_error("config.json: unsupported architecture " + shown + "; supported: " + supported_list());
  }
  result.arch = found->arch;
  result.architecture_name = name;
  result.hidden_size = required_int(config, "hidden_size");
  result.intermediate_size = required_int(config, "intermediate_size");
  result.num_layers = required_int(config, "num_hidden_layers");
  result.num_heads = required_int(config, "num_attention_heads");
  result.num_kv_heads = config.contains("num_key_value_heads") && !config["num_key_value_heads"].is_null()
                            ? required_int(config, "num_key_value_heads")
                            : result.num_heads;
  result.vocab_size = required_int(config, "vocab_size");
  if (config.contains("head_dim") && !config["head_dim"].is_null()) {
    result.head_dim = required_int(config, "head_dim");
  } else {
    if (result.hidden_size % result.num_heads != 0) {
      throw std::runtime_error("config.json: hidden_size " + std::to_string(result.hidden_size) +
                               " is not a multiple of num_attention_heads " + std::to_string(result.num_heads) +
                               " and no head_dim is given");
    }
    result.head_dim = result.hidden_size / result.num_heads;
  }
  if (result.num_heads % result.num_kv_heads != 0) {
    throw std::runtime_error("config.json: num_attention_heads " + std::to_string(result.num_heads) +
                             " is not a multiple of num_key_value_heads " + std::to_string(result.num_kv_heads));
  }
  result.max_position_embeddings = value_or<int>(config, "max_position_embeddings", 2048);
  // Sliding-window attention is not implemented. Inside the window it equals full attention, so
  // a model whose window is shorter than its context gets the window as its context (Mistral 7B
  // v0.1: 4096 of 32768) instead of silently attending further than it was trained to. Qwen2/3
  // configs name a window that applies only with use_sliding_window.
  const bool window_applies = result.arch == architecture::mistral ||
                              ((result.arch == architecture::qwen2 || result.arch == architecture::qwen3) &&
                               value_or<bool>(config, "use_sliding_window", false));
  if (window_applies && config.contains("sliding_window") && !config["sliding_window"].is_null()) {
    const int window = required_int(config, "sliding_window");
    if (window < result.max_position_embeddings) result.max_position_embeddings = window;
  }
  result.rms_norm_eps = value_or<float>(config, "rms_norm_eps", 1e-6f);
  result.rope_theta = value_or<float>(config, "rope_theta", 10000.0f);
  result.rope_scaling = parse_rope_scaling(config);
  // Qwen2 has q/k/v biases whatever the file says; others follow "attention_bias".
  result.attention_bias = result.arch == architecture::qwen2 || value_or<bool>(config, "attention_bias", false);
  result.qk_norm = result.arch == architecture::qwen3;
  result.tie_word_embeddings = value_or<bool>(config, "tie_word_embeddings", false);
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

nlohmann::json to_hf_config(const model_config& config) {
  nlohmann::json j;
  const char* model_type = "llama";
  switch (config.arch) {
    case architecture::llama: model_type = "llama"; break;
    case architecture::mistral: model_type = "mistral"; break;
    case architecture::qwen2: model_type = "qwen2"; break;
    case architecture::qwen3: model_type = "qwen3"; break;
  }
  std::string name = config.architecture_name;
  if (name.empty()) {
    for (const auto& known : known_architectures) {
      if (known.arch == config.arch) name = known.hf_name;
    }
  }
  j["architectures"] = {name};
  j["model_type"] = model_type;
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
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = config.tie_word_embeddings;
  j["attention_bias"] = config.attention_bias;
  if (config.rope_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", config.rope_scaling->factor},
                         {"low_freq_factor", config.rope_scaling->low_freq_factor},
                         {"high_freq_factor", config.rope_scaling->high_freq_factor},
                         {"original_max_position_embeddings", config.rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
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
