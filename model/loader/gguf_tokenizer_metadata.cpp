#include "model/loader/gguf_tokenizer_metadata.hpp"

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "model/loader/pretokenizer_patterns.hpp"

namespace troupe {
namespace {

using json = nlohmann::json;

struct vocabulary {
  std::vector<std::string> tokens;  // by id; gaps hold a placeholder
  std::vector<int> types;
  std::unordered_map<std::string, int> ids;
};

const json& model_of(const tokenizer_sources& sources) {
  const json& model = sources.tokenizer_json.at("model");
  if (model.value("type", "") != "BPE") {
    throw std::runtime_error("tokenizer model '" + model.value("type", std::string("?")) +
                             "' cannot be written to GGUF (supported: BPE with byte fallback, byte-level BPE)");
  }
  return model;
}

// A token named in tokenizer_config ("<s>" or {"content": "<s>", ...}).
std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content")) return value["content"].get<std::string>();
  return std::nullopt;
}

std::string merge_string(const json& merge) {
  if (merge.is_string()) return merge.get<std::string>();
  return merge.at(0).get<std::string>() + " " + merge.at(1).get<std::string>();
}

bool is_byte_token(const std::string& token) {
  return token.size() == 6 && token.rfind("<0x", 0) == 0 && token[5] == '>';
}

// The Split regex of a byte-level pre-tokenizer, if any.
std::optional<std::string> split_pattern(const json& pre) {
  if (!pre.is_object()) return std::nullopt;
  if (pre.value("type", "") == "Split" && pre.contains("pattern") && pre["pattern"].contains("Regex")) {
    return pre["pattern"]["Regex"].get<std::string>();
  }
  if (pre.value("type", "") == "Sequence") {
    for (const auto& inner : pre["pretokenizers"]) {
      if (auto pattern = split_pattern(inner)) return pattern;
    }
  }
  return std::nullopt;
}

// Whether the post-processor puts a special token before the sequence (BOS).
bool post_processor_adds_bos(const json& post) {
  if (!post.is_object()) return false;
  if (post.value("type", "") == "TemplateProcessing") {
    return !post["single"].empty() && post["single"][0].contains("SpecialToken");
  }
  if (post.value("type", "") == "Sequence") {
    for (const auto& inner : post["processors"]) {
      if (post_processor_adds_bos(inner)) return true;
    }
  }
  return false;
}

}  // namespace

int tokenizer_vocab_size(const tokenizer_sources& sources) {
  const json& model = model_of(sources);
  int size = 0;
  for (const auto& [token, id] : model.at("vocab").items()) size = std::max(size, id.get<int>() + 1);
  if (sources.tokenizer_json.contains("added_tokens")) {
    for (const auto& added : sources.tokenizer_json["added_tokens"])
      size = std::max(size, added.at("id").get<int>() + 1);
  }
  return size;
}

void add_tokenizer_metadata(gguf_writer& writer, const tokenizer_sources& sources) {
  const json& model = model_of(sources);
  const json& config = sources.tokenizer_config;
  const bool sentencepiece = model.value("byte_fallback", false);
  const int size = tokenizer_vocab_size(sources);

  vocabulary vocab;
  vocab.tokens.resize(size);
  vocab.types.assign(size, static_cast<int>(gguf_token_type::unused));
  std::vector<bool> filled(size, false);
  for (const auto& [token, id_value] : model.at("vocab").items()) {
    int id = id_value.get<int>();
    vocab.tokens[id] = token;
    vocab.types[id] = sentencepiece && is_byte_token(token) ? static_cast<int>(gguf_token_type::byte)
                                                            : static_cast<int>(gguf_token_type::normal);
    filled[id] = true;
  }
  const std::string unk_token =
      model.contains("unk_token") && model["unk_token"].is_string() ? model["unk_token"].get<std::string>() : "";
  if (sources.tokenizer_json.contains("added_tokens")) {
    for (const auto& added : sources.tokenizer_json["added_tokens"]) {
      int id = added.at("id").get<int>();
      vocab.tokens[id] = added.at("content").get<std::string>();
      vocab.types[id] = added.value("special", false) ? static_cast<int>(gguf_token_type::control)
                                                      : static_cast<int>(gguf_token_type::user_defined);
      if (vocab.tokens[id] == unk_token) vocab.types[id] = static_cast<int>(gguf_token_type::unknown);
      filled[id] = true;
    }
  }
  for (int id = 0; id < size; ++id) {
    if (!filled[id]) vocab.tokens[id] = "[PAD" + std::to_string(id) + "]";  // llama.cpp needs every id named
    vocab.ids.emplace(vocab.tokens[id], id);
  }

  writer.set("tokenizer.ggml.model", gguf_value::string(sentencepiece ? "llama" : "gpt2"));
  if (sentencepiece) {
    // llama.cpp merges the adjacent pair whose result scores highest: rank r scores -r, so the
    // GGUF merges in the same order as the HF merges. Pieces no merge makes score below all.
    const json& merges = model.at("merges");
    std::vector<float> scores(size, 0.0f);
    std::vector<bool> scored(size, false);
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      std::string text = merge_string(merges[rank]);
      size_t space = text.find(' ');
      auto it = vocab.ids.find(text.substr(0, space) + text.substr(space + 1));
      if (it != vocab.ids.end() && !scored[it->second]) {
        scores[it->second] = -static_cast<float>(rank);
        scored[it->second] = true;
      }
    }
    for (int id = 0; id < size; ++id) {
      if (!scored[id] && vocab.types[id] == static_cast<int>(gguf_token_type::normal) && vocab.tokens[id].size() > 1) {
        scores[id] = -static_cast<float>(merges.size() + id);
      }
    }
    writer.set("tokenizer.ggml.tokens", gguf_value::array(gguf_value_type::string, vocab.tokens));
    writer.set("tokenizer.ggml.scores", gguf_value::array(gguf_value_type::float32, scores));
    writer.set("tokenizer.ggml.token_type", gguf_value::array(gguf_value_type::int32, vocab.types));
    bool prepend = false;
    if (sources.tokenizer_json.contains("normalizer") && sources.tokenizer_json["normalizer"].is_object()) {
      prepend = sources.tokenizer_json["normalizer"].dump().find("\"Prepend\"") != std::string::npos;
    }
    writer.set("tokenizer.ggml.add_space_prefix", gguf_value::boolean(prepend));
  } else {
    std::string pre = "gpt-2";
    if (auto pattern = split_pattern(sources.tokenizer_json.value("pre_tokenizer", json()))) {
      if (*pattern == llama3_split_pattern) {
        pre = "llama-bpe";
      } else if (*pattern == qwen2_split_pattern) {
        pre = "qwen2";
      } else if (*pattern == o200k_split_pattern) {
        pre = "gpt-4o";
      } else {
        spdlog::warn("unknown pre-tokenizer regex; writing tokenizer.ggml.pre 'default'");
        pre = "default";
      }
    }
    json merges = json::array();
    for (const auto& merge : model.at("merges")) merges.push_back(merge_string(merge));
    writer.set("tokenizer.ggml.pre", gguf_value::string(pre));
    writer.set("tokenizer.ggml.tokens", gguf_value::array(gguf_value_type::string, vocab.tokens));
    writer.set("tokenizer.ggml.token_type", gguf_value::array(gguf_value_type::int32, vocab.types));
    writer.set("tokenizer.ggml.merges", gguf_value::array(gguf_value_type::string, merges));
  }

  auto id_of = [&](const std::optional<std::string>& token) -> std::optional<int> {
    if (!token) return std::nullopt;
    auto it = vocab.ids.find(*token);
    return it == vocab.ids.end() ? std::nullopt : std::optional<int>(it->second);
  };
  const auto bos = id_of(config_token(config, "bos_token"));
  const auto eos = id_of(config_token(config, "eos_token"));
  const auto unk = id_of(unk_token.empty() ? config_token(config, "unk_token") : std::optional<std::string>(unk_token));
  const auto pad = id_of(config_token(config, "pad_token"));
  if (bos) writer.set("tokenizer.ggml.bos_token_id", gguf_value::u32(*bos));
  if (eos) writer.set("tokenizer.ggml.eos_token_id", gguf_value::u32(*eos));
  if (unk) writer.set("tokenizer.ggml.unknown_token_id", gguf_value::u32(*unk));
  if (pad) writer.set("tokenizer.ggml.padding_token_id", gguf_value::u32(*pad));
  bool add_bos = config.is_object() && config.contains("add_bos_token") && config["add_bos_token"].is_boolean()
                     ? config["add_bos_token"].get<bool>()
                     : post_processor_adds_bos(sources.tokenizer_json.value("post_processor", json()));
  bool add_eos = config.is_object() && config.value("add_eos_token", false);
  writer.set("tokenizer.ggml.add_bos_token", gguf_value::boolean(add_bos && bos.has_value()));
  writer.set("tokenizer.ggml.add_eos_token", gguf_value::boolean(add_eos && eos.has_value()));
  if (config.is_object() && config.contains("chat_template")) {
    const json& chat_template = config["chat_template"];
    if (chat_template.is_string()) {
      writer.set("tokenizer.chat_template", gguf_value::string(chat_template.get<std::string>()));
    } else if (chat_template.is_array()) {
      for (const auto& named : chat_template) {
        if (named.value("name", "") == "default")
          writer.set("tokenizer.chat_template", gguf_value::string(named.at("template").get<std::string>()));
      }
    }
  }
}

}  // namespace troupe
