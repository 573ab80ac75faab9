#include "model/loader/hf_quantization.hpp"

#include <algorithm>
#include <cctype>
#include <stdexcept>
#include <vector>

#include "model/loader/hf_config.hpp"

namespace troupe {
namespace {

[[noreturn]] void fail(const std::string& source, const std::string& problem) {
  throw std::runtime_error(source + ": " + problem);
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

bool present(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && !it->is_null();
}

// The first of `keys` present (configs of different tool versions name a field differently).
const nlohmann::json* field(const nlohmann::json& object, std::initializer_list<const char*> keys,
                            std::string* which = nullptr) {
  for (const char* key : keys) {
    if (present(object, key)) {
      if (which) *which = key;
      return &object[key];
    }
  }
  return nullptr;
}

int64_t int_field(const nlohmann::json& object, std::initializer_list<const char*> keys, int64_t fallback,
                  const std::string& source) {
  std::string key;
  const nlohmann::json* value = field(object, keys, &key);
  if (!value) return fallback;
  if (!value->is_number_integer()) fail(source, "'" + key + "' must be an integer, got " + value->dump());
  return value->get<int64_t>();
}

bool bool_field(const nlohmann::json& object, std::initializer_list<const char*> keys, bool fallback,
                const std::string& source) {
  std::string key;
  const nlohmann::json* value = field(object, keys, &key);
  if (!value) return fallback;
  if (!value->is_boolean()) fail(source, "'" + key + "' must be true or false, got " + value->dump());
  return value->get<bool>();
}

std::string string_field(const nlohmann::json& object, std::initializer_list<const char*> keys,
                         const std::string& fallback, const std::string& source) {
  std::string key;
  const nlohmann::json* value = field(object, keys, &key);
  if (!value) return fallback;
  if (!value->is_string()) fail(source, "'" + key + "' must be a string, got " + value->dump());
  return value->get<std::string>();
}

// The int4 layouts: bits must be 4, and a group a multiple of 32 input columns, so that each
// 32-element block of the repacked rows (q4_0 / q4_1) has one scale and zero.
void read_int4_shape(const nlohmann::json& config, hf_quantization& q, std::initializer_list<const char*> bits_keys,
                     std::initializer_list<const char*> group_keys) {
  std::string bits_key = *bits_keys.begin();
  field(config, bits_keys, &bits_key);
  const int64_t bits = int_field(config, bits_keys, -1, q.source);
  if (bits != 4) {
    fail(q.source, bits < 0 ? "'" + bits_key + "' is missing; " + q.method + " checkpoints load with 4 bits"
                            : "'" + bits_key + "' is " + std::to_string(bits) + "; " + q.method +
                                  " checkpoints load with 4 bits only");
  }
  std::string group_key = *group_keys.begin();
  field(config, group_keys, &group_key);
  const int64_t group = int_field(config, group_keys, -1, q.source);
  if (group != -1 && (group <= 0 || group % 32 != 0)) {
    fail(q.source, "'" + group_key + "' is " + std::to_string(group) +
                       "; supported: -1 (one group per row) or a positive multiple of 32");
  }
  q.group_size = group == -1 ? 0 : group;
}

void parse_awq(const nlohmann::json& config, hf_quantization& q) {
  q.layout = hf_quant_layout::awq;
  read_int4_shape(config, q, {"bits", "w_bit"}, {"group_size", "q_group_size"});
  const std::string version = lower(string_field(config, {"version"}, "gemm", q.source));
  if (version != "gemm") {
    fail(q.source, "'version' is '" + version + "'; AWQ checkpoints load in the GEMM layout only (version \"gemm\")");
  }
  if (!bool_field(config, {"zero_point"}, true, q.source)) {
    fail(q.source, "'zero_point' is false; AWQ checkpoints load with zero points only (AutoAWQ's GEMM layout)");
  }
  const std::string backend = lower(string_field(config, {"backend"}, "autoawq", q.source));
  if (backend != "autoawq") {
    fail(q.source, "'backend' is '" + backend + "'; only AutoAWQ's layout (backend \"autoawq\") loads");
  }
  q.symmetric = false;
}

void parse_gptq(const nlohmann::json& config, hf_quantization& q) {
  q.layout = hf_quant_layout::gptq;
  read_int4_shape(config, q, {"bits"}, {"group_size"});
  q.act_order = bool_field(config, {"desc_act"}, false, q.source);
  q.symmetric = bool_field(config, {"sym"}, true, q.source);
  std::string format_key = "checkpoint_format";
  const std::string format = lower(string_field(config, {"checkpoint_format", "format"}, "gptq", q.source));
  field(config, {"checkpoint_format", "format"}, &format_key);
  if (format == "gptq") {
    q.zeros_minus_one = true;
  } else if (format != "gptq_v2") {
    fail(q.source, "'" + format_key + "' is '" + format + "'; supported: gptq (v1) and gptq_v2");
  }
  const std::string pack = lower(string_field(config, {"pack_dtype"}, "int32", q.source));
  if (pack != "int32" && pack != "torch.int32") {
    fail(q.source, "'pack_dtype' is '" + pack + "'; GPTQ checkpoints load packed in int32 only");
  }
  if (present(config, "dynamic") && !(config["dynamic"].is_object() && config["dynamic"].empty())) {
    fail(q.source, "'dynamic' sets per-module quantization; GPTQ checkpoints load with one setting for every module");
  }
}

void parse_fp8(const nlohmann::json& config, hf_quantization& q) {
  q.layout = hf_quant_layout::fp8;
  const std::string scheme = string_field(config, {"activation_scheme"}, "dynamic", q.source);
  if (scheme != "dynamic" && scheme != "static") {
    fail(q.source, "'activation_scheme' is '" + scheme + "'; supported: dynamic, static");
  }
  q.static_input_scales = scheme == "static";
  const std::string fmt = lower(string_field(config, {"fmt"}, "e4m3", q.source));
  if (fmt != "e4m3") fail(q.source, "'fmt' is '" + fmt + "'; FP8 weights load as e4m3 only");
  if (present(config, "weight_block_size")) {
    const nlohmann::json& block = config["weight_block_size"];
    if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() || !block[1].is_number_integer() ||
        block[0].get<int64_t>() <= 0 || block[1].get<int64_t>() <= 0) {
      fail(q.source, "'weight_block_size' must be two positive integers [rows, columns], got " + block.dump());
    }
    q.weight_block = std::array<int64_t, 2>{block[0].get<int64_t>(), block[1].get<int64_t>()};
  }
}

// compressed-tensors: one scheme for every config group (what llm-compressor's presets write).
void parse_compressed_tensors(const nlohmann::json& config, hf_quantization& q) {
  const std::string status = string_field(config, {"quantization_status"}, "compressed", q.source);
  if (status != "compressed") {
    fail(q.source, "'quantization_status' is '" + status + "'; only compressed checkpoints load");
  }
  if (present(config, "sparsity_config")) {
    const nlohmann::json& sparsity = config["sparsity_config"];
    const std::string format = sparsity.is_object() ? string_field(sparsity, {"format"}, "dense", q.source) : "dense";
    if (sparsity.is_object() && !sparsity.empty() && format != "dense") {
      fail(q.source,
           "'sparsity_config' has format '" + format + "'; sparse compressed-tensors checkpoints do not load");
    }
  }
  if (present(config, "transform_config")) fail(q.source, "'transform_config' (rotations) is not supported");
  const std::string top_format = string_field(config, {"format"}, "", q.source);
  if (!present(config, "config_groups") || !config["config_groups"].is_object() || config["config_groups"].empty()) {
    fail(q.source, "'config_groups' is missing or empty");
  }
  bool first = true;
  for (const auto& [group_name, group] : config["config_groups"].items()) {
    const std::string where = "config_groups." + group_name;
    if (!group.is_object() || !present(group, "weights")) continue;  // activations only
    const nlohmann::json& weights = group["weights"];
    const std::string format = string_field(group, {"format"}, top_format, q.source);
    const std::string type = string_field(weights, {"type"}, "int", q.source);
    const int64_t bits = int_field(weights, {"num_bits"}, 8, q.source);
    const std::string strategy = string_field(weights, {"strategy"}, "tensor", q.source);
    if (bool_field(weights, {"dynamic"}, false, q.source)) {
      fail(q.source, where + ".weights.dynamic is true; weights must be quantized in the checkpoint");
    }
    hf_quantization scheme = q;
    if (type == "float" && bits == 8) {
      if (format != "float-quantized" && format != "naive-quantized") {
        fail(q.source, "'format' is '" + format + "' for FP8 weights; supported: float-quantized, naive-quantized");
      }
      if (!bool_field(weights, {"symmetric"}, true, q.source)) {
        fail(q.source, where + ".weights.symmetric is false; FP8 weights load with symmetric scales only");
      }
      scheme.layout = hf_quant_layout::fp8;
      if (strategy == "block") {
        const nlohmann::json* block = field(weights, {"block_structure"});
        if (!block || !block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
            !(*block)[1].is_number_integer()) {
          fail(q.source, where + ".weights.block_structure must be [rows, columns] with strategy block");
        }
        scheme.weight_block = std::array<int64_t, 2>{(*block)[0].get<int64_t>(), (*block)[1].get<int64_t>()};
      } else if (strategy == "group") {
        const int64_t group_size = int_field(weights, {"group_size"}, -1, q.source);
        if (group_size <= 0) fail(q.source, where + ".weights.group_size must be positive with strategy group");
        scheme.weight_block = std::array<int64_t, 2>{1, group_size};
      } else if (strategy != "tensor" && strategy != "channel") {
        fail(q.source,
             where + ".weights.strategy is '" + strategy + "'; FP8 weights load per tensor, channel, group or block");
      }
      scheme.static_input_scales = present(group, "input_activations") && group["input_activations"].is_object() &&
                                   !bool_field(group["input_activations"], {"dynamic"}, true, q.source);
    } else if (type == "int" && bits == 4) {
      if (format != "pack-quantized") {
        fail(q.source, "'format' is '" + format + "' for int4 weights; supported: pack-quantized");
      }
      scheme.layout = hf_quant_layout::packed_int4;
      if (strategy == "group") {
        const int64_t group_size = int_field(weights, {"group_size"}, -1, q.source);
        if (group_size <= 0 || group_size % 32 != 0) {
          fail(q.source, where + ".weights.group_size is " + std::to_string(group_size) +
                             "; supported: a positive multiple of 32");
        }
        scheme.group_size = group_size;
      } else if (strategy == "channel") {
        scheme.group_size = 0;
      } else {
        fail(q.source, where + ".weights.strategy is '" + strategy + "'; int4 weights load per group or channel");
      }
      scheme.symmetric = bool_field(weights, {"symmetric"}, true, q.source);
      const std::string actorder =
          present(weights, "actorder") && weights["actorder"].is_string() ? weights["actorder"].get<std::string>() : "";
      scheme.act_order = actorder == "group";
    } else {
      fail(q.source, where + ".weights is " + type + " with num_bits " + std::to_string(bits) +
                         "; compressed-tensors checkpoints load as FP8 (type float, 8 bits) or int4 (type int, "
                         "4 bits, pack-quantized)");
    }
    if (first) {
      q = scheme;
      first = false;
    } else if (scheme.layout != q.layout || scheme.group_size != q.group_size ||
               scheme.weight_block != q.weight_block || scheme.act_order != q.act_order) {
      fail(q.source, "'config_groups' mix different weight schemes; one scheme for every group is supported");
    }
  }
  if (first) fail(q.source, "no entry of 'config_groups' quantizes weights");
}

}  // namespace

hf_quantization parse_hf_quantization(const nlohmann::json& config, const std::string& source) {
  if (!config.is_object()) fail(source, "expected a JSON object");
  hf_quantization q;
  q.source = source;
  q.method = lower(string_field(config, {"quant_method"}, "", source));
  if (q.method.empty()) fail(source, "'quant_method' is missing");
  if (q.method == "fp8") {
    parse_fp8(config, q);
  } else if (q.method == "awq") {
    parse_awq(config, q);
  } else if (q.method == "gptq") {
    parse_gptq(config, q);
  } else if (q.method == "compressed-tensors") {
    parse_compressed_tensors(config, q);
  } else {
    fail(source, "'quant_method' is '" + q.method +
                     "', which Troupe does not load (supported: fp8, compressed-tensors, awq, gptq)");
  }
  return q;
}

std::optional<hf_quantization> read_hf_quantization(const std::filesystem::path& directory) {
  const std::filesystem::path config_path = directory / "config.json";
  if (std::filesystem::exists(config_path)) {
    const nlohmann::json config = read_json_file(config_path);
    for (const char* key : {"quantization_config", "compression_config"}) {
      if (config.is_object() && present(config, key)) {
        return parse_hf_quantization(config[key], config_path.string() + " " + key);
      }
    }
  }
  // Older exports keep it in a file of its own, without a quant_method.
  struct legacy_file {
    const char* name;
    const char* method;
  };
  for (const legacy_file& legacy :
       {legacy_file{"quantize_config.json", "gptq"}, legacy_file{"quant_config.json", "awq"}}) {
    const std::filesystem::path path = directory / legacy.name;
    if (!std::filesystem::exists(path)) continue;
    nlohmann::json config = read_json_file(path);
    if (config.is_object() && !present(config, "quant_method")) config["quant_method"] = legacy.method;
    return parse_hf_quantization(config, path.string());
  }
  return std::nullopt;
}

std::string describe(const hf_quantization& q) {
  std::string text = q.method + ": ";
  switch (q.layout) {
    case hf_quant_layout::fp8:
      text += "fp8 e4m3 weights";
      if (q.weight_block) {
        text += ", scales per " + std::to_string((*q.weight_block)[0]) + "x" + std::to_string((*q.weight_block)[1]) +
                " block";
      }
      if (q.static_input_scales) text += ", static activation scales ignored (activations stay f32 on the CPU)";
      break;
    case hf_quant_layout::awq:
    case hf_quant_layout::gptq:
    case hf_quant_layout::packed_int4:
      text += "int4 weights, ";
      text += q.group_size > 0 ? "group " + std::to_string(q.group_size) : std::string("one group per row");
      if (q.act_order) text += ", act-order";
      break;
  }
  return text + " (from " + q.source + ")";
}

}  // namespace troupe
