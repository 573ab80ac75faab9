#include "text/normalizer.hpp"

#include <optional>
#include <stdexcept>
#include <vector>

#include "text/unicode/nfc.hpp"
#include "text/unicode/regex.hpp"
#include "text/unicode/utf8.hpp"

namespace troupe {

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  std::size_t pos = 0;
  while (true) {
    const std::size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

namespace {

class nfc_normalizer final : public normalizer {
 public:
  std::string normalize(std::string text) const override { return nfc_normalize(text); }
};

class prepend_normalizer final : public normalizer {
 public:
  explicit prepend_normalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  // The reference prepends unconditionally, to every section between added tokens.
  std::string normalize(std::string text) const override { return prefix_ + text; }

 private:
  std::string prefix_;
};

class replace_normalizer final : public normalizer {
 public:
  replace_normalizer(std::string literal, std::optional<unicode_regex> regex, std::string content)
      : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}

  std::string normalize(std::string text) const override {
    if (!regex_) return replace_all(text, literal_, content_);
    std::string out;
    std::size_t last = 0;
    regex_->for_each_match(text, [&](std::size_t begin, std::size_t end) {
      out.append(text, last, begin - last);
      out.append(content_);
      last = end;
    });
    out.append(text, last, std::string::npos);
    return out;
  }

 private:
  std::string literal_;
  std::optional<unicode_regex> regex_;
  std::string content_;
};

class strip_normalizer final : public normalizer {
 public:
  strip_normalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string text) const override {
    std::string_view view = text;
    if (left_) view = utf8::trim_start_js(view);
    if (right_) view = utf8::trim_end_js(view);
    return std::string(view);
  }

 private:
  bool left_, right_;
};

class sequence_normalizer final : public normalizer {
 public:
  explicit sequence_normalizer(std::vector<std::unique_ptr<normalizer>> steps) : steps_(std::move(steps)) {}
  std::string normalize(std::string text) const override {
    for (const auto& step : steps_) text = step->normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<normalizer>> steps_;
};

}  // namespace

std::unique_ptr<normalizer> normalizer::from_json(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  const std::string type = config.value("type", "");
  if (type == "NFC") return std::make_unique<nfc_normalizer>();
  if (type == "Prepend") return std::make_unique<prepend_normalizer>(config.at("prepend").get<std::string>());
  if (type == "Replace") {
    const auto& pattern = config.at("pattern");
    std::string content = config.value("content", "");
    if (pattern.contains("String"))
      return std::make_unique<replace_normalizer>(pattern["String"].get<std::string>(), std::nullopt, content);
    if (pattern.contains("Regex"))
      return std::make_unique<replace_normalizer>("", unicode_regex(pattern["Regex"].get<std::string>()), content);
    throw std::runtime_error("Replace normalizer: pattern must have a String or Regex, got " + pattern.dump());
  }
  if (type == "Strip")
    return std::make_unique<strip_normalizer>(config.value("strip_left", false), config.value("strip_right", false));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<normalizer>> steps;
    for (const auto& step : config.at("normalizers"))
      if (auto n = from_json(step)) steps.push_back(std::move(n));
    return std::make_unique<sequence_normalizer>(std::move(steps));
  }
  throw std::runtime_error("tokenizer.json normalizer type '" + type +
                           "' is not supported (expected NFC, Prepend, Replace, Strip or Sequence)");
}

}  // namespace troupe
