#include "text/added_vocabulary.hpp"

#include <algorithm>

#include "text/unicode/utf8.hpp"

namespace troupe {

void added_vocabulary::trie::insert(std::string_view key, std::int32_t value) {
  if (key.empty()) return;
  first_bytes_[static_cast<unsigned char>(key[0])] = true;
  std::int32_t current = 0;
  for (char ch : key) {
    const auto byte = static_cast<unsigned char>(ch);
    auto& children = nodes_[current].children;
    auto it = std::lower_bound(children.begin(), children.end(), byte,
                               [](const auto& c, unsigned char b) { return c.first < b; });
    if (it != children.end() && it->first == byte) {
      current = it->second;
    } else {
      const auto next = static_cast<std::int32_t>(nodes_.size());
      children.insert(it, {byte, next});
      nodes_.emplace_back();  // invalidates `children`; not used again
      current = next;
    }
  }
  // The first token listed with a content wins, like a map keyed by content.
  if (nodes_[current].value < 0) nodes_[current].value = value;
}

std::pair<std::size_t, std::int32_t> added_vocabulary::trie::longest_match(std::string_view text,
                                                                           std::size_t pos) const {
  if (!first_bytes_[static_cast<unsigned char>(text[pos])]) return {0, -1};
  std::pair<std::size_t, std::int32_t> best{0, -1};
  std::int32_t current = 0;
  for (std::size_t i = pos; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const auto& children = nodes_[current].children;
    auto it = std::lower_bound(children.begin(), children.end(), byte,
                               [](const auto& c, unsigned char b) { return c.first < b; });
    if (it == children.end() || it->first != byte) break;
    current = it->second;
    if (nodes_[current].value >= 0) best = {i + 1 - pos, nodes_[current].value};
  }
  return best;
}

void added_vocabulary::split(const trie& matcher, std::string_view text, std::vector<text_section>& out) const {
  const std::size_t first = out.size();
  if (matcher.empty()) {
    out.push_back({text, -1, 0});
  } else {
    std::size_t start = 0, pos = 0;
    while (pos < text.size()) {
      const auto [length, index] = matcher.longest_match(text, pos);
      if (length == 0) {
        ++pos;
        continue;
      }
      if (pos > start) out.push_back({text.substr(start, pos - start), -1, 0});
      out.push_back({text.substr(pos, length), index, 0});
      pos += length;
      start = pos;
    }
    if (start < text.size()) out.push_back({text.substr(start), -1, 0});
  }
  // lstrip / rstrip eat the whitespace of the neighbouring text sections.
  for (std::size_t i = first; i < out.size(); ++i) {
    if (out[i].token < 0) continue;
    const added_token& token = tokens_[out[i].token];
    if (token.lstrip && i > first && out[i - 1].token < 0) out[i - 1].text = utf8::trim_end_js(out[i - 1].text);
    if (token.rstrip && i + 1 < out.size() && out[i + 1].token < 0)
      out[i + 1].text = utf8::trim_start_js(out[i + 1].text);
  }
  for (std::size_t i = first; i < out.size(); ++i) {
    out[i].index = i - first;
    if (out[i].token >= 0) out[i].token = tokens_[out[i].token].id;
  }
}

}  // namespace troupe
