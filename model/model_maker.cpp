#include "model/model_maker.hpp"

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>

#include "model/architecture.hpp"
#include "model/half_float.hpp"
#include "model/loader/dummy_weights.hpp"
#include "model/loader/float_conversion.hpp"
#include "model/loader/gguf_model_loader.hpp"
#include "model/loader/gguf_model_metadata.hpp"
#include "model/loader/gguf_tensor_names.hpp"
#include "model/loader/gguf_tokenizer_metadata.hpp"
#include "model/loader/gguf_writer.hpp"
#include "model/loader/hf_config.hpp"
#include "model/loader/hf_tensor_forms.hpp"
#include "model/loader/rope_permutation.hpp"
#include "model/loader/safetensors_writer.hpp"
#include "model/loader/tokenizer_sources.hpp"
#include "model/model_tensors.hpp"
#include "model/rope_frequencies.hpp"

namespace troupe {
namespace {

void write_json(const std::filesystem::path& path, const nlohmann::json& value) {
  std::ofstream out(path, std::ios::trunc);
  out << value.dump(2) << "\n";
  if (!out) throw std::runtime_error("cannot write '" + path.string() + "'");
}

// GGUF file_type: what most tensors hold (llama.cpp shows it; it does not drive loading). An
// all-k-quant file is named as llama.cpp's _S mix of that type.
uint32_t gguf_file_type(dtype type) {
  switch (type) {
    case dtype::f32: return 0;
    case dtype::f16: return 1;
    case dtype::q4_0: return 2;
    case dtype::q4_1: return 3;
    case dtype::q8_0: return 7;
    case dtype::q5_0: return 8;
    case dtype::q5_1: return 9;
    case dtype::q2_k: return 10;
    case dtype::q3_k: return 11;
    case dtype::q4_k: return 14;
    case dtype::q5_k: return 16;
    case dtype::q6_k: return 18;
    case dtype::iq4_nl: return 25;
    case dtype::iq4_xs: return 30;
    case dtype::bf16: return 32;
    case dtype::mxfp4: return 38;
    case dtype::fp8_e4m3:
    case dtype::fp8_e4m3_b128: break;
  }
  throw std::runtime_error("a GGUF file cannot hold " + std::string(dtype_name(type)));
}

std::vector<std::byte> encode(const std::vector<float>& values, dtype type) {
  std::vector<std::byte> bytes(row_bytes(type, static_cast<int64_t>(values.size())));
  convert_from_f32(values, type, bytes.data());
  return bytes;
}

// The model's random values by canonical tensor: sinks -infinity unless asked for (inert).
std::function<std::vector<float>(const tensor_spec&)> value_source(const model_maker_options& options) {
  const dummy_init init{options.init_stddev, options.norm_jitter};
  return [init, options](const tensor_spec& spec) {
    std::vector<float> values = dummy_tensor_values(spec, options.seed, init);
    if (spec.role == tensor_role::sinks && !options.attention_sinks) {
      std::fill(values.begin(), values.end(), -std::numeric_limits<float>::infinity());
    }
    return values;
  };
}

void write_gguf(const made_model& made, const model_maker_options& options, const tokenizer_sources& tokenizer) {
  const model_config& config = made.config;
  gguf_writer writer;
  // No architecture in the name: llama.cpp treats a model whose name holds "phi3" as having
  // Phi-3's special tokens, which a test tokenizer (stories260K's) does not.
  add_model_metadata(writer, config, "troupe random model");
  writer.set("general.file_type", gguf_value::u32(gguf_file_type(options.type)));
  add_tokenizer_metadata(writer, tokenizer);

  const auto values_of = value_source(options);
  std::map<std::string, tensor_spec> specs;
  for (const tensor_spec& spec : expected_tensors(config)) specs[spec.name] = spec;
  for (const gguf_tensor_layout& layout : gguf_tensor_layouts(config)) {
    std::vector<float> values;
    for (const std::string& part : layout.parts) {
      std::vector<float> part_values = values_of(specs.at(part));
      values.insert(values.end(), part_values.begin(), part_values.end());
    }
    // A 16-bit model's HF copy holds every tensor in its dtype, norms and biases too; the GGUF
    // keeps those in F32 (as llama.cpp wants), so they get the values the HF copy holds, as
    // llama.cpp's converter would read them: the two copies are the same weights.
    if (options.type == dtype::f16 || options.type == dtype::bf16) {
      for (float& v : values) v = options.type == dtype::f16 ? f16_to_f32(f32_to_f16(v)) : bf16_to_f32(f32_to_bf16(v));
    }
    if (layout.permuted_heads > 0) {
      std::vector<float> permuted(values.size());
      const int64_t rows = layout.shape.front();
      permute_rows_hf_to_gguf(reinterpret_cast<const std::byte*>(values.data()),
                              reinterpret_cast<std::byte*>(permuted.data()), rows, values.size() / rows * sizeof(float),
                              layout.permuted_heads);
      values.swap(permuted);
    }
    if (layout.norm_plus_one) {
      for (float& v : values) v += 1.0f;
    }
    // llama.cpp wants norms, biases (stacked experts' too) and sinks in F32; a quantized row
    // must be whole blocks (rows that are not stay f16).
    const bool one_d = layout.shape.size() == 1 || layout.gguf_1d;
    const tensor_role role = specs.at(layout.parts.front()).role;
    dtype type = one_d || role != tensor_role::matrix ? dtype::f32 : options.type;
    if (layout.shape.back() % dtype_block_size(type) != 0) type = dtype::f16;
    std::vector<int64_t> dims = one_d ? std::vector<int64_t>{static_cast<int64_t>(values.size())}
                                      : std::vector<int64_t>{layout.shape.rbegin(), layout.shape.rend()};
    writer.add_tensor(layout.gguf_name, gguf_type_of(type), dims, encode(values, type));
  }
  for (const gguf_extra_tensor& extra : gguf_rope_tensors(config)) {
    writer.add_tensor(extra.name, gguf_tensor_type::f32, {static_cast<int64_t>(extra.values.size())},
                      encode(extra.values, dtype::f32));
  }
  writer.write(made.gguf_path);
}

void write_hf(const made_model& made, const model_maker_options& options, const tokenizer_sources& tokenizer) {
  const model_config& config = made.config;
  const dtype type = is_quantized(options.type) ? dtype::f16 : options.type;
  nlohmann::json hf_config = to_hf_config(config);
  hf_config["torch_dtype"] = type == dtype::f32 ? "float32" : type == dtype::f16 ? "float16" : "bfloat16";
  write_json(made.hf_dir / "config.json", hf_config);
  nlohmann::json generation = {{"_from_model_config", true}};
  if (config.bos_token_id >= 0) generation["bos_token_id"] = config.bos_token_id;
  if (!config.eos_token_ids.empty()) generation["eos_token_id"] = config.eos_token_ids;
  write_json(made.hf_dir / "generation_config.json", generation);
  write_json(made.hf_dir / "tokenizer.json", tokenizer.tokenizer_json);
  write_json(made.hf_dir / "tokenizer_config.json", tokenizer.tokenizer_config);

  std::vector<std::vector<std::byte>> buffers;
  std::vector<weight_tensor> tensors;
  for (const hf_checkpoint_tensor& t : hf_checkpoint_tensors(config, value_source(options))) {
    buffers.push_back(encode(t.values, type));
    weight_tensor tensor;
    tensor.name = t.name;
    tensor.type = type;
    tensor.shape = t.shape;
    tensor.data = buffers.back().data();
    tensor.num_bytes = buffers.back().size();
    tensors.push_back(std::move(tensor));
  }
  write_safetensors(made.hf_dir / "model.safetensors", tensors);
}

int token_id(const tokenizer_sources& tokenizer, const char* key) {
  const auto& config = tokenizer.tokenizer_config;
  if (!config.is_object() || !config.contains(key)) return -1;
  const auto& value = config[key];
  std::string content = value.is_string()   ? value.get<std::string>()
                        : value.is_object() ? value.value("content", "")
                                            : "";
  if (content.empty()) return -1;
  for (const auto& added : tokenizer.tokenizer_json.value("added_tokens", nlohmann::json::array())) {
    if (added.value("content", "") == content) return added.at("id").get<int>();
  }
  const auto& vocab = tokenizer.tokenizer_json.at("model").at("vocab");
  return vocab.contains(content) ? vocab[content].get<int>() : -1;
}

int positive(int value, const char* name) {
  if (value <= 0) throw std::runtime_error(std::string(name) + " must be positive, got " + std::to_string(value));
  return value;
}

int or_default(int value, int fallback, const char* name) { return value == 0 ? fallback : positive(value, name); }

void configure_rope_scaling(const model_maker_options& options, model_config& config) {
  std::string kind = options.rope_scaling;
  if (kind.empty()) kind = options.arch == "llama3" ? "llama3" : config.arch == architecture::gpt_oss ? "yarn" : "none";
  if (kind == "none") return;
  rope_scaling_config s;
  s.factor = options.rope_scaling_factor > 0 ? options.rope_scaling_factor : kind == "llama3" ? 8.0f : 4.0f;
  s.original_max_position_embeddings = static_cast<int>(config.max_position_embeddings / s.factor);
  if (s.original_max_position_embeddings < 1)
    throw std::runtime_error("--max-position-embeddings is too small for the rope scaling factor");
  const int half = rotary_dims(config) / 2;
  if (kind == "linear") {
    s.type = rope_scaling_type::linear;
  } else if (kind == "dynamic") {
    s.type = rope_scaling_type::dynamic;
  } else if (kind == "llama3") {
    s.type = rope_scaling_type::llama3;
    s.original_max_position_embeddings = 8192;  // Llama 3.1's
  } else if (kind == "yarn") {
    s.type = rope_scaling_type::yarn;
    s.truncate = config.arch != architecture::gpt_oss;  // gpt-oss's config says truncate: false
  } else if (kind == "longrope") {
    s.type = rope_scaling_type::longrope;
    for (int i = 0; i < half; ++i) {
      // Phi-3's factors rise from ~1 at high frequencies; long ones towards the scaling factor.
      s.short_factor.push_back(1.0f + 0.5f * static_cast<float>(i) / half);
      s.long_factor.push_back(1.0f + (s.factor - 1.0f) * static_cast<float>(i) / half);
    }
    s.attention_factor = longrope_attention_factor(config.max_position_embeddings, s.original_max_position_embeddings);
  } else {
    throw std::runtime_error("unknown --rope-scaling '" + kind +
                             "' (expected none, linear, dynamic, llama3, yarn or longrope)");
  }
  config.rope_scaling = s;
}

}  // namespace

model_config model_maker_config(const model_maker_options& options, int vocab_size) {
  const std::string arch_name = options.arch == "llama3" ? "llama" : options.arch;
  const std::optional<architecture> arch = architecture_from_name(arch_name);
  if (!arch)
    throw std::runtime_error("unknown --arch '" + options.arch + "' (expected llama3 or one of " +
                             architecture_names() + ")");
  const architecture_traits& traits = traits_of(*arch);
  model_config config;
  config.arch = *arch;
  config.architecture_name = std::string(traits.hf_name);
  config.attention_bias = traits.always_attention_bias;
  config.qk_norm = traits.always_qk_norm;
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
  if (config.head_dim % 2 != 0)
    throw std::runtime_error("head_dim must be even for RoPE, got " + std::to_string(config.head_dim));
  if (options.rotary_dim != 0) {
    if (options.rotary_dim < 0 || options.rotary_dim % 2 != 0 || options.rotary_dim > config.head_dim) {
      throw std::runtime_error("--rotary-dim must be even and at most head_dim " + std::to_string(config.head_dim) +
                               ", got " + std::to_string(options.rotary_dim));
    }
    if (options.rotary_dim != config.head_dim) config.rotary_dim = options.rotary_dim;
  }
  config.vocab_size = positive(vocab_size, "vocab size");
  config.max_position_embeddings = positive(options.max_position_embeddings, "--max-position-embeddings");
  config.tie_word_embeddings = options.tie_word_embeddings;
  switch (config.arch) {
    case architecture::llama:
    case architecture::mistral:
    case architecture::mixtral:
    case architecture::phi3: config.rms_norm_eps = 1e-5f; break;
    default: config.rms_norm_eps = 1e-6f; break;
  }
  config.rope_theta = options.arch == "llama3"                                                  ? 500000.0f
                      : config.arch == architecture::llama || config.arch == architecture::phi3 ? 10000.0f
                      : config.arch == architecture::gpt_oss                                    ? 150000.0f
                                                                                                : 1000000.0f;

  if (traits.experts) {
    moe_config& moe = config.moe;
    moe.num_experts = or_default(options.num_experts, 8, "--experts");
    moe.experts_per_token = or_default(options.experts_per_token, 2, "--experts-per-token");
    if (moe.experts_per_token > moe.num_experts) {
      throw std::runtime_error("--experts-per-token " + std::to_string(moe.experts_per_token) + " exceeds --experts " +
                               std::to_string(moe.num_experts));
    }
    const bool qwen = config.arch == architecture::qwen2_moe || config.arch == architecture::qwen3_moe;
    moe.expert_intermediate_size = or_default(
        options.expert_intermediate_size, qwen ? std::max(1, config.intermediate_size / 2) : config.intermediate_size,
        "--expert-intermediate-size");
    // Mixtral's and gpt-oss's config.json name the experts' width intermediate_size.
    if (!qwen) config.intermediate_size = moe.expert_intermediate_size;
    if (config.arch == architecture::qwen2_moe) {
      moe.shared_expert_intermediate_size = or_default(options.shared_expert_intermediate_size,
                                                       config.intermediate_size, "--shared-expert-intermediate-size");
    }
    moe.norm_topk_prob =
        config.arch == architecture::mixtral || options.norm_topk_prob.value_or(config.arch == architecture::qwen3_moe);
    if (config.arch == architecture::gpt_oss) {
      moe.scoring = router_scoring::softmax_over_top_k;
      moe.router_bias = true;
      moe.expert_bias = true;
      moe.norm_topk_prob = false;
      config.activation = activation_kind::swiglu_oai;
      config.attention_sinks = true;
    }
  } else if (options.num_experts != 0 || options.experts_per_token != 0) {
    throw std::runtime_error("--experts applies to mixtral, qwen2_moe, qwen3_moe and gpt_oss only, not " +
                             options.arch);
  }

  int window = options.sliding_window;
  if (config.arch == architecture::gemma2 || config.arch == architecture::gemma3) {
    config.activation = activation_kind::gelu_tanh;
    config.query_pre_attn_scalar = static_cast<float>(config.head_dim);
    config.tie_word_embeddings = true;  // llama.cpp's Gemma 2 has no output.weight
    if (window == 0) window = config.arch == architecture::gemma2 ? 4096 : 512;
    if (config.arch == architecture::gemma2) {
      config.attn_logit_softcapping = options.attn_logit_softcapping.value_or(50.0f);
      config.final_logit_softcapping = options.final_logit_softcapping.value_or(30.0f);
    } else {
      if (options.attn_logit_softcapping) throw std::runtime_error("Gemma 3 has no attention soft-capping");
      config.final_logit_softcapping = options.final_logit_softcapping.value_or(0.0f);
      config.rope_local_theta = 10000.0f;
    }
  } else if (options.attn_logit_softcapping || options.final_logit_softcapping) {
    throw std::runtime_error("--attn-softcap and --final-softcap apply to gemma2 and gemma3 only");
  }
  if (config.arch == architecture::gpt_oss && window == 0) window = 128;
  if (window > 0) {
    // Gemma 3: five sliding layers to a full one; Gemma 2 and gpt-oss alternate; Mistral v0.1
    // slides on every layer.
    const int pattern = config.arch == architecture::gemma3 ? 6 : config.arch == architecture::mistral ? 1 : 2;
    if (config.arch != architecture::gemma2 && config.arch != architecture::gemma3 &&
        config.arch != architecture::gpt_oss && config.arch != architecture::mistral) {
      throw std::runtime_error("--sliding-window applies to mistral, gemma2, gemma3 and gpt_oss only");
    }
    config.sliding_window = positive(window, "--sliding-window");
    config.sliding_layers.resize(config.num_layers);
    for (int i = 0; i < config.num_layers; ++i) config.sliding_layers[i] = pattern == 1 || (i + 1) % pattern != 0;
  }
  configure_rope_scaling(options, config);
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
