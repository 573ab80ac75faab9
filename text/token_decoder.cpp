#include "text/token_decoder.hpp"

#include <stdexcept>

#include "text/byte_level.hpp"
#include "text/normalizer.hpp"

namespace troupe {

std::string clean_up_tokenization(std::string text) {
  static const std::pair<const char*, const char*> rules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : rules) text = replace_all(text, from, to);
  return text;
}

namespace {

std::string single_character(const nlohmann::json& config, const char* what) {
  const std::string content = config.value("content", " ");
  std::size_t pos = 0;
  if (content.empty() || (utf8::next(content, pos), pos != content.size()))
    throw std::runtime_error(std::string(what) + " decoder: content must be one character, got '" + content + "'");
  return content;
}

std::pair<std::string, std::string> replacement(const nlohmann::json& config) {
  const auto& pattern = config.at("pattern");
  if (!pattern.contains("String"))
    throw std::runtime_error("Replace decoder: only String patterns are supported, got " + pattern.dump());
  return {pattern["String"].get<std::string>(), config.value("content", "")};
}

// Drops up to `count` leading and trailing copies of `content` from one token.
std::string strip_token(std::string text, const std::string& content, std::size_t start, std::size_t stop) {
  std::size_t begin = 0;
  for (std::size_t i = 0; i < start && text.compare(begin, content.size(), content) == 0; ++i) begin += content.size();
  std::size_t end = text.size();
  for (std::size_t i = 0;
       i < stop && end >= begin + content.size() && text.compare(end - content.size(), content.size(), content) == 0;
       ++i)
    end -= content.size();
  return text.substr(begin, end - begin);
}

}  // namespace

token_decoder::token_decoder(const nlohmann::json& decoder, bool clean_up_tokenization_spaces)
    : clean_up_(clean_up_tokenization_spaces) {
  if (decoder.is_null()) {
    kind_ = kind::join_with_space;
    return;
  }
  const std::string type = decoder.value("type", "");
  if (type == "ByteLevel") {
    kind_ = kind::byte_level;
    return;
  }
  kind_ = kind::pieces;
  if (type == "Metaspace") {
    replacements_.emplace_back(decoder.value("replacement", "\u2581"), " ");
    metaspace_ = decoder.value("prepend_scheme", "always") != "never" && decoder.value("add_prefix_space", true);
    return;
  }
  const nlohmann::json steps = type == "Sequence" ? decoder.at("decoders") : nlohmann::json::array({decoder});
  bool fused = false;
  for (const auto& step : steps) {
    const std::string step_type = step.value("type", "");
    if (step_type == "Replace" && !fused && !byte_fallback_) {
      replacements_.push_back(replacement(step));
    } else if (step_type == "ByteFallback" && !fused && !byte_fallback_) {
      byte_fallback_ = true;
    } else if (step_type == "Fuse") {
      fused = true;
    } else if (step_type == "Strip" && fused && strip_content_.empty()) {
      strip_content_ = single_character(step, "Strip");
      strip_start_ = step.value("start", 0);
      strip_stop_ = step.value("stop", 0);
    } else if (step_type == "Strip" && !fused && !byte_fallback_ && token_strip_content_.empty()) {
      token_strip_content_ = single_character(step, "Strip");
      token_strip_start_ = step.value("start", 0);
      token_strip_stop_ = step.value("stop", 0);
    } else {
      throw std::runtime_error(
          "decoder step '" + step_type + "' in " + decoder.dump() +
          " is not supported here (expected Replace/Strip per token, ByteFallback, Fuse, then Strip)");
    }
  }
}

token_decoder::state token_decoder::start(bool continuation) const {
  state s;
  s.strip_left = strip_start_;
  if (continuation) {
    s.first_token = false;
    s.strip_left_done = true;
    s.raw = true;
  }
  return s;
}

std::string token_decoder::token_bytes(std::string_view token, bool is_added) const {
  switch (kind_) {
    case kind::join_with_space: return " " + std::string(token);
    case kind::byte_level: {
      if (is_added) return std::string(token);
      std::string bytes;
      for (std::size_t pos = 0; pos < token.size();) {
        const std::size_t begin = pos;
        const int byte = byte_level::char_to_byte(utf8::next(token, pos));
        if (byte >= 0) {
          bytes.push_back(static_cast<char>(byte));
        } else {
          bytes.append(token.substr(begin, pos - begin));
        }
      }
      return bytes;
    }
    case kind::pieces: {
      std::string text(token);
      for (const auto& [from, to] : replacements_) {
        if (text.find(from) != std::string::npos) text = replace_all(text, from, to);
      }
      if (!token_strip_content_.empty())
        text = strip_token(std::move(text), token_strip_content_, token_strip_start_, token_strip_stop_);
      if (byte_fallback_ && text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') {
        const auto hex = [](char c) {
          return c >= '0' && c <= '9'   ? c - '0'
                 : c >= 'A' && c <= 'F' ? c - 'A' + 10
                 : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                        : -1;
        };
        const int high = hex(text[3]), low = hex(text[4]);
        if (high >= 0 && low >= 0) return std::string(1, static_cast<char>(high * 16 + low));
      }
      return text;
    }
  }
  return std::string(token);
}

void token_decoder::push(state& s, std::string_view token, bool is_added, std::string& out) const {
  const bool first = s.first_token;
  s.first_token = false;
  switch (kind_) {
    case kind::join_with_space:
      if (!first) push_text(s, " ", out);
      push_text(s, token, out);
      return;
    case kind::byte_level: {
      if (is_added) {  // added tokens are spelled as themselves, not in the byte alphabet
        push_text(s, token, out);
        return;
      }
      std::string text;
      for (std::size_t pos = 0; pos < token.size();) {
        const std::size_t begin = pos;
        const int byte = byte_level::char_to_byte(utf8::next(token, pos));
        if (byte >= 0) {
          s.bytes.push(static_cast<unsigned char>(byte), text);
        } else {
          for (std::size_t i = begin; i < pos; ++i) s.bytes.push(static_cast<unsigned char>(token[i]), text);
        }
      }
      after_strip(s, text, out);
      return;
    }
    case kind::pieces: {
      std::string text(token);
      for (const auto& [from, to] : replacements_) {
        if (text.find(from) != std::string::npos) text = replace_all(text, from, to);
      }
      if (metaspace_ && first && !text.empty() && text[0] == ' ') text.erase(0, 1);
      if (!token_strip_content_.empty())
        text = strip_token(std::move(text), token_strip_content_, token_strip_start_, token_strip_stop_);
      if (byte_fallback_ && text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') {
        const auto hex = [](char c) {
          return c >= '0' && c <= '9'   ? c - '0'
                 : c >= 'A' && c <= 'F' ? c - 'A' + 10
                 : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                        : -1;
        };
        const int high = hex(text[3]), low = hex(text[4]);
        if (high >= 0 && low >= 0) {
          std::string decoded;
          s.bytes.push(static_cast<unsigned char>(high * 16 + low), decoded);
          after_strip(s, decoded, out);
          return;
        }
      }
      push_text(s, text, out);
      return;
    }
  }
}

void token_decoder::push_text(state& s, std::string_view text, std::string& out) const {
  if (!s.bytes.pending()) {  // the common case: no byte run to end first
    after_strip(s, text, out);
    return;
  }
  std::string flushed;
  s.bytes.flush(flushed);
  flushed.append(text);
  after_strip(s, flushed, out);
}

// Applies the whole-text Strip, then hands over to clean-up.
void token_decoder::after_strip(state& s, std::string_view text, std::string& out) const {
  if (text.empty()) return;
  if (strip_content_.empty() || s.raw) {
    emit(s, text, out);
    return;
  }
  while (!s.strip_left_done && s.strip_left > 0 && !text.empty()) {
    if (text.compare(0, strip_content_.size(), strip_content_) != 0) break;
    text.remove_prefix(strip_content_.size());
    --s.strip_left;
  }
  if (text.empty()) return;
  s.strip_left_done = true;
  if (strip_stop_ == 0) {
    emit(s, text, out);
    return;
  }
  // Hold back the trailing copies of the strip character (at most strip_stop_ of them).
  std::string combined = std::move(s.held_trailing);
  combined.append(text);
  std::size_t end = combined.size();
  for (std::size_t i = 0; i < strip_stop_ && end >= strip_content_.size() &&
                          combined.compare(end - strip_content_.size(), strip_content_.size(), strip_content_) == 0;
       ++i)
    end -= strip_content_.size();
  s.held_trailing = combined.substr(end);
  emit(s, std::string_view(combined).substr(0, end), out);
}

void token_decoder::emit(state& s, std::string_view text, std::string& out) const {
  if (!clean_up_ || s.raw) {
    out.append(text);
    return;
  }
  // Every clean-up rule starts with a space and spans at most 4 bytes, all ASCII; so the text can
  // be cut after any 4 non-space bytes and each side cleaned on its own.
  s.cleanup_pending.append(text);
  const std::string& pending = s.cleanup_pending;
  std::size_t cut = pending.size();
  while (cut > 0) {
    const bool boundary = cut == pending.size() || (static_cast<unsigned char>(pending[cut]) & 0xC0) != 0x80;
    const std::size_t window = cut >= 4 ? cut - 4 : 0;
    if (boundary && cut >= 4 && pending.find(' ', window) >= cut) break;
    --cut;
  }
  if (cut == 0) return;
  out += clean_up_tokenization(pending.substr(0, cut));
  s.cleanup_pending.erase(0, cut);
}

void token_decoder::finish(state& s, std::string& out) const {
  std::string flushed;
  s.bytes.flush(flushed);
  after_strip(s, flushed, out);
  s.held_trailing.clear();  // trailing strip characters at the very end are dropped
  if (clean_up_) {
    out += clean_up_tokenization(std::move(s.cleanup_pending));
    s.cleanup_pending.clear();
  }
}

}  // namespace troupe
