#include "text/pre_tokenizer.hpp"

#include <optional>
#include <stdexcept>

#include "text/normalizer.hpp"
#include "text/unicode/regex.hpp"

namespace troupe {
namespace {

enum class split_behavior { isolated, removed, merged_with_previous, merged_with_next };

class split_pre_tokenizer final : public pre_tokenizer {
 public:
  split_pre_tokenizer(std::optional<unicode_regex> regex, std::string literal, split_behavior behavior, bool invert)
      : regex_(std::move(regex)), literal_(std::move(literal)), behavior_(behavior), invert_(invert) {}

  void pre_tokenize(std::vector<std::string>& pieces, std::size_t) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 2);
    for (const auto& piece : pieces) split(piece, out);
    pieces = std::move(out);
  }

 private:
  template <typename F>
  void for_each_match(const std::string& text, F&& on_match) const {
    if (regex_) {
      regex_->for_each_match(text, on_match);
      return;
    }
    if (literal_.empty()) return;
    for (std::size_t pos = text.find(literal_); pos != std::string::npos;
         pos = text.find(literal_, pos + literal_.size()))
      on_match(pos, pos + literal_.size());
  }

  void split(const std::string& text, std::vector<std::string>& out) const {
    std::size_t last = 0;
    std::string carry;  // a match waiting to be glued to the next gap (merged_with_next)
    auto emit = [&](std::string s) {
      if (!s.empty()) out.push_back(std::move(s));
    };
    for_each_match(text, [&](std::size_t begin, std::size_t end) {
      std::string gap = text.substr(last, begin - last);
      std::string match = text.substr(begin, end - begin);
      last = end;
      if (invert_) {
        emit(std::move(match));
        return;
      }
      switch (behavior_) {
        case split_behavior::isolated:
          emit(std::move(gap));
          emit(std::move(match));
          break;
        case split_behavior::removed: emit(std::move(gap)); break;
        case split_behavior::merged_with_previous:
          if (!gap.empty() || out.empty())
            emit(gap + match);
          else
            out.back() += match;
          break;
        case split_behavior::merged_with_next:
          emit(carry + gap);
          carry = std::move(match);
          break;
      }
    });
    if (invert_) return;
    emit(carry + text.substr(last));
  }

  std::optional<unicode_regex> regex_;
  std::string literal_;
  split_behavior behavior_;
  bool invert_;
};

// GPT-2's own split, used when a ByteLevel pre-tokenizer has use_regex.
constexpr const char* gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

class byte_level_pre_tokenizer final : public pre_tokenizer {
 public:
  byte_level_pre_tokenizer(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_.emplace(gpt2_pattern);
  }

  void pre_tokenize(std::vector<std::string>& pieces, std::size_t) const override {
    if (!add_prefix_space_ && !regex_) return;
    std::vector<std::string> out;
    out.reserve(pieces.size());
    for (auto& piece : pieces) {
      // The reference adds the space to every piece that lacks one, not only the first.
      if (add_prefix_space_ && (piece.empty() || piece[0] != ' ')) piece.insert(piece.begin(), ' ');
      if (!regex_) {
        out.push_back(std::move(piece));
        continue;
      }
      regex_->for_each_match(
          piece, [&](std::size_t begin, std::size_t end) { out.push_back(piece.substr(begin, end - begin)); });
    }
    pieces = std::move(out);
  }

  bool is_byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::optional<unicode_regex> regex_;
};

class metaspace_pre_tokenizer final : public pre_tokenizer {
 public:
  metaspace_pre_tokenizer(std::string replacement, std::string prepend_scheme)
      : replacement_(std::move(replacement)), prepend_scheme_(std::move(prepend_scheme)) {}

  void pre_tokenize(std::vector<std::string>& pieces, std::size_t section_index) const override {
    for (auto& piece : pieces) {
      piece = replace_all(piece, " ", replacement_);
      const bool prepend = prepend_scheme_ == "always" || (prepend_scheme_ == "first" && section_index == 0);
      if (prepend && piece.compare(0, replacement_.size(), replacement_) != 0) piece.insert(0, replacement_);
    }
  }

 private:
  std::string replacement_;
  std::string prepend_scheme_;
};

class sequence_pre_tokenizer final : public pre_tokenizer {
 public:
  explicit sequence_pre_tokenizer(std::vector<std::unique_ptr<pre_tokenizer>> steps) : steps_(std::move(steps)) {
    for (std::size_t i = 0; i + 1 < steps_.size(); ++i)
      if (steps_[i]->is_byte_level())
        throw std::runtime_error(
            "pre_tokenizer Sequence: a ByteLevel step must be the last one (it changes the alphabet)");
  }

  void pre_tokenize(std::vector<std::string>& pieces, std::size_t section_index) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces, section_index);
  }

  bool is_byte_level() const override { return !steps_.empty() && steps_.back()->is_byte_level(); }

 private:
  std::vector<std::unique_ptr<pre_tokenizer>> steps_;
};

split_behavior parse_behavior(const std::string& name) {
  if (name == "Isolated") return split_behavior::isolated;
  if (name == "Removed") return split_behavior::removed;
  if (name == "MergedWithPrevious") return split_behavior::merged_with_previous;
  if (name == "MergedWithNext") return split_behavior::merged_with_next;
  throw std::runtime_error("Split pre-tokenizer behavior '" + name +
                           "' is not supported (expected Isolated, Removed, MergedWithPrevious or MergedWithNext)");
}

}  // namespace

std::unique_ptr<pre_tokenizer> pre_tokenizer::from_json(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  const std::string type = config.value("type", "");
  if (type == "Split") {
    const auto& pattern = config.at("pattern");
    const auto behavior = parse_behavior(config.value("behavior", "Isolated"));
    const bool invert = config.value("invert", false);
    if (pattern.contains("Regex"))
      return std::make_unique<split_pre_tokenizer>(unicode_regex(pattern["Regex"].get<std::string>()), "", behavior,
                                                   invert);
    if (pattern.contains("String"))
      return std::make_unique<split_pre_tokenizer>(std::nullopt, pattern["String"].get<std::string>(), behavior,
                                                   invert);
    throw std::runtime_error("Split pre-tokenizer: pattern must have a String or Regex, got " + pattern.dump());
  }
  if (type == "ByteLevel") {
    const bool add_prefix_space = config.value("add_prefix_space", false);
    const bool use_regex = config.value("use_regex", true);
    return std::make_unique<byte_level_pre_tokenizer>(add_prefix_space, use_regex);
  }
  if (type == "Metaspace") {
    std::string scheme = config.value("prepend_scheme", "always");
    if (config.contains("add_prefix_space") && config["add_prefix_space"].is_boolean() &&
        !config["add_prefix_space"].get<bool>())
      scheme = "never";
    return std::make_unique<metaspace_pre_tokenizer>(config.value("replacement", "\u2581"), scheme);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<pre_tokenizer>> steps;
    for (const auto& step : config.at("pretokenizers"))
      if (auto p = from_json(step)) steps.push_back(std::move(p));
    return std::make_unique<sequence_pre_tokenizer>(std::move(steps));
  }
  throw std::runtime_error("tokenizer.json pre_tokenizer type '" + type +
                           "' is not supported (expected Split, ByteLevel, Metaspace or Sequence)");
}

}  // namespace troupe
