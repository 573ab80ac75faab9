#include "model/model_maker.hpp"

#include <fstream>
#include <memory>
#include <stdexcept>

#include "model/loader/dummy_weights.hpp"
#include "model/loader/float_conversion.hpp"
#include "model/loader/gguf_model_loader.hpp"
#include "model/loader/gguf_tensor_names.hpp"
#include "model/loader/gguf_tokenizer_metadata.hpp"
#include "model/loader/gguf_writer.hpp"
#include "model/loader/hf_config.hpp"
#include "model/loader/rope_permutation.hpp"
#include "model/loader/safetensors_writer.hpp"
#include "model/loader/tokenizer_sources.hpp"
#include "model/model_tensors.hpp"

namespace troupe {
namespace {

void write_json(const std::filesystem::path& path, const nlohmann::json& value) {
  std::ofstream out(path, std::ios::trunc);
  out << value.dump(2) << "\n";
  if (!out) throw std::runtime_error("cannot write '" + path.string() + "'");
}

const char* gguf_architecture(architecture arch) {
  switch (arch) {
    case architecture::llama:
    case architecture::mistral: return "llama";  // llama.cpp runs Mistral as llama
    case architecture::qwen2: return "qwen2";
    case architecture::qwen3: return "qwen3";
  }
  return "llama";
}

// GGUF file_type: what most tensors hold (llama.cpp shows it; it does not drive loading).
uint32_t gguf_file_type(dtype type) {
  switch (type) {
    case dtype::f32: return 0;
    case dtype::f16: return 1;
    case dtype::q8_0: return 7;
    case dtype::bf16: return 32;
    default: return 0;  // the quantizer writes the presets' file types
  }
}

std::vector<std::byte> encode(const std::vector<float>& values, dtype type) {
  std::vector<std::byte> bytes(row_bytes(type, static_cast<int64_t>(values.size())));
  convert_from_f32(values, type, bytes.data());
  return bytes;
}

void write_gguf(const made_model& made, const model_maker_options& options, const tokenizer_sources& tokenizer) {
  const model_config& config = made.config;
  const std::string arch = gguf_architecture(config.arch);
  const std::string p = arch + ".";
  gguf_writer writer;
  writer.set("general.architecture", gguf_value::string(arch));
  writer.set("general.name", gguf_value::string("troupe-" + options.arch));
  writer.set("general.file_type", gguf_value::u32(gguf_file_type(options.type)));
  writer.set(p + "context_length", gguf_value::u32(config.max_position_embeddings));
  writer.set(p + "embedding_length", gguf_value::u32(config.hidden_size));
  writer.set(p + "feed_forward_length", gguf_value::u32(config.intermediate_size));
  writer.set(p + "block_count", gguf_value::u32(config.num_layers));
  writer.set(p + "attention.head_count", gguf_value::u32(config.num_heads));
  writer.set(p + "attention.head_count_kv", gguf_value::u32(config.num_kv_heads));
  writer.set(p + "attention.key_length", gguf_value::u32(config.head_dim));
  writer.set(p + "attention.value_length", gguf_value::u32(config.head_dim));
  writer.set(p + "attention.layer_norm_rms_epsilon", gguf_value::f32(config.rms_norm_eps));
  writer.set(p + "rope.freq_base", gguf_value::f32(config.rope_theta));
  writer.set(p + "rope.dimension_count", gguf_value::u32(config.head_dim));
  writer.set(p + "vocab_size", gguf_value::u32(config.vocab_size));
  if (config.rope_scaling) {
    // llama.cpp reads Llama 3 scaling from rope_freqs.weight; Troupe also keeps the parameters.
    writer.set("troupe.rope_scaling.factor", gguf_value::f32(config.rope_scaling->factor));
    writer.set("troupe.rope_scaling.low_freq_factor", gguf_value::f32(config.rope_scaling->low_freq_factor));
    writer.set("troupe.rope_scaling.high_freq_factor", gguf_value::f32(config.rope_scaling->high_freq_factor));
    writer.set("troupe.rope_scaling.original_max_position_embeddings",
               gguf_value::u32(config.rope_scaling->original_max_position_embeddings));
  }
  add_tokenizer_metadata(writer, tokenizer);

  const bool permute = arch == "llama";
  const dummy_init init{options.init_stddev, options.norm_jitter};
  for (const auto& spec : expected_tensors(config)) {
    std::vector<float> values = dummy_tensor_values(spec, options.seed, init);
    if (permute && (spec.name.find(".q_proj.") != std::string::npos || spec.name.find(".k_proj.") != std::string::npos)) {
      const int heads = spec.name.find(".q_proj.") != std::string::npos ? config.num_heads : config.num_kv_heads;
      std::vector<float> permuted(values.size());
      const int64_t rows = spec.shape.front();
      permute_rows_hf_to_gguf(reinterpret_cast<const std::byte*>(values.data()), reinterpret_cast<std::byte*>(permuted.data()),
                              rows, values.size() / rows * sizeof(float), heads);
      values.swap(permuted);
    }
    // llama.cpp wants 1-D tensors (norms, biases) in F32; a Q8_0 row must be whole blocks.
    dtype type = spec.shape.size() == 1 ? dtype::f32 : options.type;
    if (type == dtype::q8_0 && spec.shape.back() % q8_0_block_size != 0) type = dtype::f16;
    writer.add_tensor(gguf_name_from_hf(spec.name), gguf_type_of(type), {spec.shape.rbegin(), spec.shape.rend()},
                      encode(values, type));
  }
  if (config.rope_scaling) {
    writer.add_tensor("rope_freqs.weight", gguf_tensor_type::f32, {config.head_dim / 2},
                      encode(llama3_rope_factors(config), dtype::f32));
  }
  writer.write(made.gguf_path);
}

void write_hf(const made_model& made, const model_maker_options& options, const tokenizer_sources& tokenizer) {
  const model_config& config = made.config;
  const dtype type = options.type == dtype::q8_0 ? dtype::f16 : options.type;
  nlohmann::json hf_config = to_hf_config(config);
  hf_config["torch_dtype"] = type == dtype::f32 ? "float32" : type == dtype::f16 ? "float16" : "bfloat16";
  if (config.arch == architecture::mistral) hf_config["sliding_window"] = nullptr;
  write_json(made.hf_dir / "config.json", hf_config);
  nlohmann::json generation = {{"_from_model_config", true}};
  if (config.bos_token_id >= 0) generation["bos_token_id"] = config.bos_token_id;
  if (!config.eos_token_ids.empty()) generation["eos_token_id"] = config.eos_token_ids;
  write_json(made.hf_dir / "generation_config.json", generation);
  write_json(made.hf_dir / "tokenizer.json", tokenizer.tokenizer_json);
  write_json(made.hf_dir / "tokenizer_config.json", tokenizer.tokenizer_config);

  const dummy_init init{options.init_stddev, options.norm_jitter};
  std::vector<std::vector<std::byte>> buffers;
  std::vector<weight_tensor> tensors;
  for (const auto& spec : expected_tensors(config)) {
    buffers.push_back(encode(dummy_tensor_values(spec, options.seed, init), type));
    tensors.push_back({spec.name, type, spec.shape, buffers.back().data(), buffers.back().size()});
  }
  write_safetensors(made.hf_dir / "model.safetensors", tensors);
}

int token_id(const tokenizer_sources& tokenizer, const char* key) {
  const auto& config = tokenizer.tokenizer_config;
  if (!config.is_object() || !config.contains(key)) return -1;
  const auto& value = config[key];
  std::string content = value.is_string() ? value.get<std::string>() : value.is_object() ? value.value("content", "") : "";
  if (content.empty()) return -1;
  for (const auto& added : tokenizer.tokenizer_json.value("added_tokens", nlohmann::json::array())) {
    if (added.value("content", "") == content) return added.at("id").get<int>();
  }
  const auto& vocab = tokenizer.tokenizer_json.at("model").at("vocab");
  return vocab.contains(content) ? vocab[content].get<int>() : -1;
}

}  // namespace

model_config model_maker_config(const model_maker_options& options, int vocab_size) {
  model_config config;
  if (options.arch == "llama" || options.arch == "llama3") {
    config.arch = architecture::llama;
    config.architecture_name = "LlamaForCausalLM";
  } else if (options.arch == "mistral") {
    config.arch = architecture::mistral;
    config.architecture_name = "MistralForCausalLM";
  } else if (options.arch == "qwen2") {
    config.arch = architecture::qwen2;
    config.architecture_name = "Qwen2ForCausalLM";
    config.attention_bias = true;
  } else if (options.arch == "qwen3") {
    config.arch = architecture::qwen3;
    config.architecture_name = "Qwen3ForCausalLM";
    config.qk_norm = true;
  } else {
    throw std::runtime_error("unknown --arch '" + options.arch + "' (expected llama, llama3, mistral, qwen2 or qwen3)");
  }
  auto positive = [](int value, const char* name) {
    if (value <= 0) throw std::runtime_error(std::string(name) + " must be positive, got " + std::to_string(value));
    return value;
  };
  config.hidden_size = positive(options.hidden_size, "--hidden-size");
  config.intermediate_size = positive(options.intermediate_size, "--intermediate-size");
  config.num_layers = positive(options.num_layers, "--layers");
  config.num_heads = positive(options.num_heads, "--heads");
  config.num_kv_heads = positive(options.num_kv_heads, "--kv-heads");
  if (config.num_heads % config.num_kv_heads != 0) {
    throw std::runtime_error("--heads " + std::to_string(config.num_heads) + " must be a multiple of --kv-heads " +
                             std::to_string(config.num_kv_heads));
  }
  if (options.head_dim > 0) {
    config.head_dim = options.head_dim;
  } else if (config.hidden_size % config.num_heads == 0) {
    config.head_dim = config.hidden_size / config.num_heads;
  } else {
    throw std::runtime_error("--hidden-size must be a multiple of --heads unless --head-dim is given");
  }
  if (config.head_dim % 2 != 0) throw std::runtime_error("head_dim must be even for RoPE, got " + std::to_string(config.head_dim));
  config.vocab_size = positive(vocab_size, "vocab size");
  config.max_position_embeddings = positive(options.max_position_embeddings, "--max-position-embeddings");
  config.tie_word_embeddings = options.tie_word_embeddings;
  config.rms_norm_eps = config.arch == architecture::qwen2 || config.arch == architecture::qwen3 ? 1e-6f : 1e-5f;
  config.rope_theta = options.arch == "llama3" ? 500000.0f : config.arch == architecture::llama ? 10000.0f : 1000000.0f;
  if (options.arch == "llama3") config.rope_scaling = rope_scaling_config{8.0f, 1.0f, 4.0f, 8192};
  return config;
}

made_model make_model(const model_maker_options& options) {
  if (options.out.empty()) throw std::runtime_error("--out DIR is required");
  if (options.tokenizer.empty()) throw std::runtime_error("--tokenizer is required (HF dir, tokenizer.json or .gguf)");
  tokenizer_sources tokenizer = load_tokenizer_sources(options.tokenizer);
  const int vocab_size = tokenizer_vocab_size(tokenizer);
  if (options.vocab_size > 0 && options.vocab_size != vocab_size) {
    throw std::runtime_error("--vocab-size " + std::to_string(options.vocab_size) + " differs from the tokenizer's " +
                             std::to_string(vocab_size) + " tokens ('" + options.tokenizer.string() + "')");
  }
  made_model made;
  made.config = model_maker_config(options, vocab_size);
  made.config.bos_token_id = token_id(tokenizer, "bos_token");
  if (int eos = token_id(tokenizer, "eos_token"); eos >= 0) made.config.eos_token_ids = {eos};
  made.hf_dir = options.out;
  made.gguf_path = options.out / "model.gguf";
  std::filesystem::create_directories(options.out);
  write_hf(made, options, tokenizer);
  write_gguf(made, options, tokenizer);
  return made;
}

}  // namespace troupe
