#include "text/tokenizer.hpp"

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include "text/tokenizer_impl.hpp"
#include "text/unicode/utf8.hpp"

namespace troupe {
namespace detail {
namespace {

const nlohmann::json& null_json() {
  static const nlohmann::json value;
  return value;
}

const nlohmann::json& config_value(const nlohmann::json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return null_json();
  return config[key];
}

// tokenizer_config writes a token either as a string or as {"content": "...", ...}.
std::string token_string(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return "";
}

std::vector<added_token> parse_added_tokens(const nlohmann::json& tokenizer_json) {
  std::vector<added_token> tokens;
  if (!tokenizer_json.contains("added_tokens") || tokenizer_json["added_tokens"].is_null()) return tokens;
  for (const auto& t : tokenizer_json["added_tokens"]) {
    added_token token;
    token.id = t.at("id").get<std::int32_t>();
    token.content = t.at("content").get<std::string>();
    token.special = t.value("special", false);
    token.lstrip = t.value("lstrip", false);
    token.rstrip = t.value("rstrip", false);
    token.single_word = t.value("single_word", false);
    // As in the reference: special tokens are matched raw unless they say otherwise.
    token.normalized =
        t.contains("normalized") && t["normalized"].is_boolean() ? t["normalized"].get<bool>() : !token.special;
    if (token.id < 0) throw std::runtime_error("added token '" + token.content + "' has a negative id");
    tokens.push_back(std::move(token));
  }
  return tokens;
}

std::string parse_chat_template(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
    for (const auto& entry : value)
      if (entry.value("name", "") == "default") return entry.value("template", "");
    throw std::runtime_error("tokenizer_config chat_template is a list without a template named 'default'");
  }
  return "";
}

}  // namespace

tokenizer_impl::tokenizer_impl(const nlohmann::json& tokenizer_json, const nlohmann::json& config)
    : normalizer_(normalizer::from_json(config_value(tokenizer_json, "normalizer"))),
      pre_tokenizer_(pre_tokenizer::from_json(config_value(tokenizer_json, "pre_tokenizer"))),
      model(tokenizer_json.at("model")),
      added(parse_added_tokens(tokenizer_json),
            [this](const std::string& content) { return normalizer_ ? normalizer_->normalize(content) : content; }) {
  const nlohmann::json& clean_up = config_value(config, "clean_up_tokenization_spaces");
  // Absent means no clean-up (current transformers default; it would break round trips).
  decoder = token_decoder(config_value(tokenizer_json, "decoder"), clean_up.is_boolean() && clean_up.get<bool>());

  for (const auto& token : added.tokens()) added_by_content.emplace(token.content, token.id);

  std::int32_t limit = model.id_limit();
  for (const auto& token : added.tokens()) limit = std::max(limit, token.id + 1);
  entries.resize(static_cast<std::size_t>(limit));
  for (std::int32_t id = 0; id < model.id_limit(); ++id) entries[id].text = model.id_to_token(id);
  for (const auto& token : added.tokens()) entries[token.id] = {&token.content, true, token.special};
  const nlohmann::json& extra = config_value(config, "additional_special_tokens");
  if (extra.is_array()) {
    for (const auto& value : extra)
      if (const auto id = lookup(token_string(value))) entries[*id].special = true;
  }

  post = post_processor::from_json(config_value(tokenizer_json, "post_processor"),
                                   [this](std::string_view t) { return lookup(t); });

  bos_token = token_string(config_value(config, "bos_token"));
  eos_token = token_string(config_value(config, "eos_token"));
  if (!bos_token.empty())
    bos_id = lookup(bos_token);
  else if (!config.is_object() || !config.contains("bos_token")) {
    // No config: the post-processor's leading special token is the BOS.
    if (!post.prefix.empty()) {
      bos_id = post.prefix.front();
      bos_token = *entries[*bos_id].text;
    }
  }
  // tokenizer_config's add_bos_token / add_eos_token matter when the post-processor adds nothing.
  const nlohmann::json& add_bos = config_value(config, "add_bos_token");
  if (add_bos.is_boolean() && add_bos.get<bool>() && bos_id && post.prefix.empty()) post.prefix.push_back(*bos_id);
  const nlohmann::json& add_eos = config_value(config, "add_eos_token");
  if (!eos_token.empty()) {
    if (const auto id = lookup(eos_token)) {
      eos_ids.push_back(*id);
      if (add_eos.is_boolean() && add_eos.get<bool>() && post.suffix.empty()) post.suffix.push_back(*id);
    }
  } else {
    for (const char* name : {"</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>"}) {
      const auto it = added_by_content.find(std::string_view(name));
      if (it != added_by_content.end() && entries[it->second].special) eos_ids.push_back(it->second);
    }
    if (!eos_ids.empty()) eos_token = *entries[eos_ids.front()].text;
  }
  chat_template = parse_chat_template(config_value(config, "chat_template"));
}

std::optional<std::int32_t> tokenizer_impl::lookup(std::string_view token) const {
  if (const auto it = added_by_content.find(token); it != added_by_content.end()) return it->second;
  return model.token_to_id(token);
}

void tokenizer_impl::encode_section(std::string_view text, std::size_t section_index,
                                    std::vector<std::int32_t>& ids) const {
  std::string normalized = normalizer_ ? normalizer_->normalize(std::string(text)) : std::string(text);
  if (normalized.empty()) return;
  std::vector<text_section> parts;
  added.split_normalized(normalized, parts);
  const bool byte_level = pre_tokenizer_ && pre_tokenizer_->is_byte_level();
  std::vector<std::string> pieces;
  for (const auto& part : parts) {
    if (part.token >= 0) {
      ids.push_back(part.token);
      continue;
    }
    if (part.text.empty()) continue;
    const std::size_t first = ids.size();
    pieces.assign(1, std::string(part.text));
    if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces, section_index);
    for (const auto& piece : pieces) model.encode(piece, byte_level, ids);
    if (model.fuse_unk() && model.unk_id()) {
      // Runs of unknown tokens become one.
      const std::int32_t unk = *model.unk_id();
      auto end = std::unique(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end(),
                             [unk](std::int32_t a, std::int32_t b) { return a == unk && b == unk; });
      ids.erase(end, ids.end());
    }
  }
}

}  // namespace detail

tokenizer tokenizer::from_json(const nlohmann::json& tokenizer_json, const nlohmann::json& tokenizer_config) {
  if (!tokenizer_json.is_object() || !tokenizer_json.contains("model"))
    throw std::runtime_error("tokenizer.json must be an object with a 'model' (got " +
                             std::string(tokenizer_json.type_name()) + ")");
  return tokenizer(std::make_shared<const detail::tokenizer_impl>(tokenizer_json, tokenizer_config));
}

namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path.string() + " is not valid JSON: " + e.what());
  }
}

}  // namespace

tokenizer tokenizer::from_directory(const std::filesystem::path& dir) {
  const auto json_path = dir / "tokenizer.json";
  if (!std::filesystem::exists(json_path))
    throw std::runtime_error("no tokenizer.json in " + dir.string() + " (expected a Hugging Face model directory)");
  return from_file(json_path);
}

tokenizer tokenizer::from_file(const std::filesystem::path& tokenizer_json_path) {
  const auto config_path = tokenizer_json_path.parent_path() / "tokenizer_config.json";
  nlohmann::json config = std::filesystem::exists(config_path) ? read_json(config_path) : nlohmann::json();
  return from_json(read_json(tokenizer_json_path), config);
}

std::vector<std::int32_t> tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const auto& impl = *impl_;
  std::string sanitized;
  if (!utf8::is_valid(text)) {
    sanitized = utf8::sanitize(text);
    text = sanitized;
  }
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), impl.post.prefix.begin(), impl.post.prefix.end());
  std::vector<text_section> sections;
  impl.added.split_raw(text, sections);
  for (const auto& section : sections) {
    if (section.token >= 0)
      ids.push_back(section.token);
    else if (!section.text.empty())
      impl.encode_section(section.text, section.index, ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), impl.post.suffix.begin(), impl.post.suffix.end());
  return ids;
}

std::string tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  incremental_detokenizer detokenizer(*this, skip_special_tokens);
  std::string out;
  for (std::int32_t id : ids) out += detokenizer.push(id);
  out += detokenizer.finish();
  return out;
}

std::int32_t tokenizer::vocab_size() const { return static_cast<std::int32_t>(impl_->entries.size()); }

std::optional<std::int32_t> tokenizer::token_to_id(std::string_view token) const { return impl_->lookup(token); }

std::string tokenizer::id_to_token(std::int32_t id) const {
  if (id < 0 || id >= vocab_size() || impl_->entries[id].text == nullptr) return "";
  return *impl_->entries[id].text;
}

std::string tokenizer::token_bytes(std::int32_t id) const {
  if (id < 0 || id >= vocab_size() || impl_->entries[id].text == nullptr) return {};
  const auto& entry = impl_->entries[id];
  return impl_->decoder.token_bytes(*entry.text, entry.added);
}

bool tokenizer::is_special(std::int32_t id) const { return id >= 0 && id < vocab_size() && impl_->entries[id].special; }

std::optional<std::int32_t> tokenizer::bos_token_id() const { return impl_->bos_id; }
std::vector<std::int32_t> tokenizer::eos_token_ids() const { return impl_->eos_ids; }
std::string tokenizer::bos_token() const { return impl_->bos_token; }
std::string tokenizer::eos_token() const { return impl_->eos_token; }
const std::string& tokenizer::chat_template_source() const { return impl_->chat_template; }

}  // namespace troupe
