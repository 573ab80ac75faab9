#include "model/loader/tokenizer_sources.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>

#include "model/loader/gguf_file.hpp"
#include "model/loader/hf_config.hpp"
#include "model/loader/pretokenizer_patterns.hpp"

namespace troupe {
namespace {

using json = nlohmann::json;

// Splits UTF-8 text into code points (as byte strings); HF splits pieces by character.
std::vector<std::string> utf8_characters(const std::string& text) {
  std::vector<std::string> characters;
  for (size_t i = 0; i < text.size();) {
    unsigned char lead = static_cast<unsigned char>(text[i]);
    size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xe ? 3 : (lead >> 3) == 0x1e ? 4 : 1;
    length = std::min(length, text.size() - i);
    characters.push_back(text.substr(i, length));
    i += length;
  }
  return characters;
}

std::string merge_text(const std::string& left, const std::string& right) { return left + " " + right; }

json merge_entry(const std::string& left, const std::string& right) {
  // The "a b" form cannot hold pieces with spaces; tokenizers also accepts [a, b].
  if (left.find(' ') != std::string::npos || right.find(' ') != std::string::npos) return json::array({left, right});
  return merge_text(left, right);
}

// SentencePiece BPE has scores, not merges: a piece is made by merging any split of it into
// two vocabulary pieces, the highest-scoring piece first. Listing those splits by descending
// score (then by the ids of the halves) gives the equivalent ranked merges.
json merges_from_scores(const std::vector<std::string>& tokens, const json& scores, const std::vector<int>& types,
                        const std::unordered_map<std::string, int>& ids) {
  struct candidate {
    float score;
    int piece, left, right;
  };
  std::vector<candidate> candidates;
  auto is_normal = [&](int id) { return types[id] == static_cast<int>(gguf_token_type::normal); };
  for (int piece = 0; piece < static_cast<int>(tokens.size()); ++piece) {
    if (!is_normal(piece)) continue;
    std::vector<std::string> characters = utf8_characters(tokens[piece]);
    std::string left;
    for (size_t split = 1; split < characters.size(); ++split) {
      left += characters[split - 1];
      std::string right = tokens[piece].substr(left.size());
      auto l = ids.find(left);
      auto r = ids.find(right);
      if (l == ids.end() || r == ids.end() || !is_normal(l->second) || !is_normal(r->second)) continue;
      candidates.push_back({scores[piece].get<float>(), piece, l->second, r->second});
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const candidate& a, const candidate& b) {
    if (a.score != b.score) return a.score > b.score;
    return std::tie(a.piece, a.left, a.right) < std::tie(b.piece, b.left, b.right);
  });
  json merges = json::array();
  for (const auto& c : candidates) merges.push_back(merge_entry(tokens[c.left], tokens[c.right]));
  return merges;
}

json template_processing(const std::vector<std::string>& tokens, int bos, int eos, bool add_bos, bool add_eos) {
  json single = json::array();
  json pair = json::array();
  json special = json::object();
  auto add_special = [&](json& sequence, int id, int type_id) {
    sequence.push_back({{"SpecialToken", {{"id", tokens[id]}, {"type_id", type_id}}}});
    special[tokens[id]] = {{"id", tokens[id]}, {"ids", {id}}, {"tokens", {tokens[id]}}};
  };
  if (add_bos) add_special(single, bos, 0);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos) add_special(single, eos, 0);
  if (add_bos) add_special(pair, bos, 0);
  pair.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos) add_special(pair, eos, 0);
  if (add_bos) add_special(pair, bos, 1);
  pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
  if (add_eos) add_special(pair, eos, 1);
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", special}};
}

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json split_then_byte_level(const char* pattern) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
            byte_level(false)}}};
}

}  // namespace

tokenizer_sources tokenizer_sources_from_gguf(const gguf_file& file) {
  const std::string model = file.find_string("tokenizer.ggml.model").value_or("");
  if (model != "llama" && model != "gpt2") {
    throw std::runtime_error("GGUF file '" + file.path().string() + "': unsupported tokenizer.ggml.model '" + model +
                             "' (supported: llama, gpt2)");
  }
  const json& token_array = file.get_array("tokenizer.ggml.tokens");
  std::vector<std::string> tokens;
  tokens.reserve(token_array.size());
  for (const auto& t : token_array) tokens.push_back(t.get<std::string>());
  const int vocab_size = static_cast<int>(tokens.size());
  std::vector<int> types(tokens.size(), static_cast<int>(gguf_token_type::normal));
  if (file.find("tokenizer.ggml.token_type")) {
    const json& type_array = file.get_array("tokenizer.ggml.token_type");
    if (type_array.size() != tokens.size()) {
      throw std::runtime_error("GGUF file '" + file.path().string() + "': token_type has " +
                               std::to_string(type_array.size()) + " entries for " + std::to_string(tokens.size()) +
                               " tokens");
    }
    for (size_t i = 0; i < tokens.size(); ++i) types[i] = type_array[i].get<int>();
  }
  auto token_id = [&](const char* key) -> int {
    auto id = file.find_int(key);
    if (!id) return -1;
    if (*id < 0 || *id >= vocab_size) {
      throw std::runtime_error("GGUF file '" + file.path().string() + "': " + key + " " + std::to_string(*id) +
                               " is outside the vocabulary");
    }
    return static_cast<int>(*id);
  };
  const int bos = token_id("tokenizer.ggml.bos_token_id");
  const int eos = token_id("tokenizer.ggml.eos_token_id");
  const int unk = token_id("tokenizer.ggml.unknown_token_id");
  const int pad = token_id("tokenizer.ggml.padding_token_id");
  const bool add_bos = file.find_bool("tokenizer.ggml.add_bos_token").value_or(model == "llama") && bos >= 0;
  const bool add_eos = file.find_bool("tokenizer.ggml.add_eos_token").value_or(false) && eos >= 0;

  json vocab = json::object();  // std::map-backed: an ordered_json object would be quadratic here
  std::unordered_map<std::string, int> ids;
  for (int id = 0; id < vocab_size; ++id) {
    if (ids.emplace(tokens[id], id).second) vocab[tokens[id]] = id;
  }

  json added = json::array();
  json added_decoder = json::object();
  for (int id = 0; id < vocab_size; ++id) {
    auto type = static_cast<gguf_token_type>(types[id]);
    if (type != gguf_token_type::control && type != gguf_token_type::unknown && type != gguf_token_type::user_defined)
      continue;
    const bool special = type != gguf_token_type::user_defined;
    json entry = {{"content", tokens[id]}, {"single_word", false}, {"lstrip", false},
                  {"rstrip", false},       {"normalized", false},  {"special", special}};
    added_decoder[std::to_string(id)] = entry;
    entry["id"] = id;
    added.push_back(entry);
  }

  json tokenizer;
  tokenizer["version"] = "1.0";
  tokenizer["truncation"] = nullptr;
  tokenizer["padding"] = nullptr;
  tokenizer["added_tokens"] = added;
  json config;
  if (model == "llama") {
    const bool add_space_prefix = file.find_bool("tokenizer.ggml.add_space_prefix").value_or(true);
    json normalizers = json::array();
    if (add_space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
    normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
    tokenizer["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
    tokenizer["pre_tokenizer"] = nullptr;
    json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                 {{"type", "ByteFallback"}},
                                 {{"type", "Fuse"}}});
    if (add_space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    tokenizer["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
    json scores = file.find("tokenizer.ggml.scores") ? file.get_array("tokenizer.ggml.scores") : json();
    if (!scores.is_array() || scores.size() != tokens.size()) {
      throw std::runtime_error("GGUF file '" + file.path().string() + "': a llama tokenizer needs one score per token");
    }
    tokenizer["model"] = {{"type", "BPE"},
                          {"dropout", nullptr},
                          {"unk_token", unk >= 0 ? json(tokens[unk]) : json()},
                          {"continuing_subword_prefix", nullptr},
                          {"end_of_word_suffix", nullptr},
                          {"fuse_unk", true},
                          {"byte_fallback", true},
                          {"ignore_merges", false},
                          {"vocab", vocab},
                          {"merges", merges_from_scores(tokens, scores, types, ids)}};
    config["tokenizer_class"] = "LlamaTokenizerFast";
    config["legacy"] = true;
  } else {
    const std::string pre = file.find_string("tokenizer.ggml.pre").value_or("default");
    const bool llama3 = pre == "llama-bpe" || pre == "llama3" || pre == "smaug-bpe";
    const bool o200k = pre == "gpt-4o";
    tokenizer["normalizer"] = pre == "qwen2" ? json{{"type", "NFC"}} : json();
    tokenizer["pre_tokenizer"] = llama3           ? split_then_byte_level(llama3_split_pattern)
                                 : pre == "qwen2" ? split_then_byte_level(qwen2_split_pattern)
                                 : o200k          ? split_then_byte_level(o200k_split_pattern)
                                                  : byte_level(true);
    tokenizer["decoder"] = {
        {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
    json merges = json::array();
    if (file.find("tokenizer.ggml.merges")) {
      for (const auto& m : file.get_array("tokenizer.ggml.merges")) merges.push_back(m.get<std::string>());
    }
    tokenizer["model"] = {{"type", "BPE"},
                          {"dropout", nullptr},
                          {"unk_token", nullptr},
                          {"continuing_subword_prefix", nullptr},
                          {"end_of_word_suffix", nullptr},
                          {"fuse_unk", false},
                          {"byte_fallback", false},
                          {"ignore_merges", llama3 || o200k},
                          {"vocab", vocab},
                          {"merges", merges}};
    config["tokenizer_class"] = "PreTrainedTokenizerFast";
  }
  tokenizer["post_processor"] =
      (add_bos || add_eos)
          ? template_processing(tokens, bos, eos, add_bos, add_eos)
          : json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  if (model == "llama" && !add_bos && !add_eos) tokenizer["post_processor"] = nullptr;

  config["add_bos_token"] = add_bos;
  config["add_eos_token"] = add_eos;
  config["bos_token"] = bos >= 0 ? json(tokens[bos]) : json();
  config["eos_token"] = eos >= 0 ? json(tokens[eos]) : json();
  config["unk_token"] = unk >= 0 ? json(tokens[unk]) : json();
  config["pad_token"] = pad >= 0 ? json(tokens[pad]) : json();
  config["clean_up_tokenization_spaces"] = false;
  config["added_tokens_decoder"] = added_decoder;
  if (auto context = file.find_int(file.find_string("general.architecture").value_or("") + ".context_length")) {
    config["model_max_length"] = *context;
  }
  if (auto chat_template = file.find_string("tokenizer.chat_template")) config["chat_template"] = *chat_template;
  return {json(std::move(tokenizer)), std::move(config)};
}

tokenizer_sources load_tokenizer_sources(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) throw std::runtime_error("tokenizer path '" + path.string() + "' does not exist");
  if (!std::filesystem::is_directory(path) && path.extension() == ".gguf") {
    return tokenizer_sources_from_gguf(gguf_file::open(path));
  }
  std::filesystem::path tokenizer_path = std::filesystem::is_directory(path) ? path / "tokenizer.json" : path;
  if (!std::filesystem::exists(tokenizer_path)) {
    throw std::runtime_error("no tokenizer.json in '" + path.string() + "'");
  }
  tokenizer_sources sources;
  sources.tokenizer_json = read_json_file(tokenizer_path);
  if (!sources.tokenizer_json.is_object() || !sources.tokenizer_json.contains("model")) {
    throw std::runtime_error("'" + tokenizer_path.string() + "' is not a tokenizer.json (no \"model\")");
  }
  std::filesystem::path config_path = tokenizer_path.parent_path() / "tokenizer_config.json";
  sources.tokenizer_config = std::filesystem::exists(config_path) ? read_json_file(config_path) : json::object();
  return sources;
}

}  // namespace troupe
