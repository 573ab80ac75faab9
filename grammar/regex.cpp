#include "grammar/regex.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "grammar/grammar_error.hpp"

namespace troupe {

namespace {

constexpr uint32_t max_codepoint = 0x10FFFF;
constexpr uint32_t surrogate_lo = 0xD800;
constexpr uint32_t surrogate_hi = 0xDFFF;
// A bound on {n,m}: each copy is compiled, so a larger count is a mistake or an attack.
constexpr int max_repeat_count = 10000;

const std::vector<codepoint_range> digit_ranges = {{'0', '9'}};
const std::vector<codepoint_range> word_ranges = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const std::vector<codepoint_range> space_ranges = {
    {'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x2028, 0x2029}, {0xFEFF, 0xFEFF}};

class parser {
 public:
  explicit parser(std::string_view pattern) : text_(pattern) {}

  regex_tree parse() {
    if (!at_end() && peek() == '^') ++pos_;
    tree_.root = parse_alternation();
    if (!at_end() && peek() == '$' && pos_ + 1 == text_.size()) ++pos_;
    if (!at_end()) {
      if (peek() == ')') fail("an unmatched ')'");
      fail("'" + std::string(1, peek()) + "' here (anchors are supported only at the pattern's ends)");
    }
    return std::move(tree_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw grammar_error("regex at offset " + std::to_string(pos_) + ": unsupported or malformed: " + what);
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }

  // One UTF-8 character of the pattern.
  uint32_t next_char() {
    const auto lead = static_cast<unsigned char>(text_[pos_]);
    int length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
    if (length == 0 || pos_ + length > text_.size()) fail("invalid UTF-8 in the pattern");
    uint32_t cp = length == 1 ? lead : lead & (0x3F >> (length - 1));
    for (int i = 1; i < length; ++i) {
      const auto c = static_cast<unsigned char>(text_[pos_ + i]);
      if ((c & 0xC0) != 0x80) fail("invalid UTF-8 in the pattern");
      cp = (cp << 6) | (c & 0x3F);
    }
    pos_ += length;
    return cp;
  }

  int char_node(std::vector<codepoint_range> ranges) {
    regex_node node;
    node.kind = regex_node::type::char_class;
    node.ranges = normalize_ranges(std::move(ranges));
    return tree_.add(std::move(node));
  }

  int parse_alternation() {
    std::vector<int> options{parse_concat()};
    while (!at_end() && peek() == '|') {
      ++pos_;
      options.push_back(parse_concat());
    }
    if (options.size() == 1) return options[0];
    regex_node node;
    node.kind = regex_node::type::alternation;
    node.children = std::move(options);
    return tree_.add(std::move(node));
  }

  int parse_concat() {
    std::vector<int> parts;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$' && pos_ + 1 == text_.size()) break;
      parts.push_back(parse_quantified());
    }
    if (parts.size() == 1) return parts[0];
    regex_node node;
    node.kind = parts.empty() ? regex_node::type::empty : regex_node::type::concat;
    node.children = std::move(parts);
    return tree_.add(std::move(node));
  }

  int read_count() {
    const size_t start = pos_;
    long value = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      value = value * 10 + (peek() - '0');
      if (value > max_repeat_count) fail("a repetition count above " + std::to_string(max_repeat_count));
      ++pos_;
    }
    if (pos_ == start) fail("a '{' that starts no repetition count");
    return static_cast<int>(value);
  }

  int parse_quantified() {
    int atom = parse_atom();
    while (!at_end()) {
      int min = 0, max = -1;
      const char c = peek();
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        min = 1;
        ++pos_;
      } else if (c == '?') {
        max = 1;
        ++pos_;
      } else if (c == '{') {
        ++pos_;
        min = read_count();
        if (!at_end() && peek() == ',') {
          ++pos_;
          max = !at_end() && peek() == '}' ? -1 : read_count();
        } else {
          max = min;
        }
        if (at_end() || peek() != '}') fail("a repetition without its closing '}'");
        ++pos_;
        if (max >= 0 && max < min) fail("the repetition {" + std::to_string(min) + "," + std::to_string(max) + "}");
      } else {
        break;
      }
      if (!at_end() && peek() == '?') ++pos_;  // lazy: the same language
      if (!at_end() && peek() == '+') fail("a possessive quantifier");
      regex_node node;
      node.kind = regex_node::type::repeat;
      node.children = {atom};
      node.min = min;
      node.max = max;
      atom = tree_.add(std::move(node));
    }
    return atom;
  }

  int parse_atom() {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (!at_end() && peek() == '?') {
        if (pos_ + 1 < text_.size() && text_[pos_ + 1] == ':') {
          pos_ += 2;
        } else {
          fail("a group of the form (?...) other than (?:...) (lookaround and named groups)");
        }
      }
      const int inner = parse_alternation();
      if (at_end() || peek() != ')') fail("a '(' without its ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return parse_class();
    if (c == '.') {
      ++pos_;
      return char_node(complement_ranges({{'\n', '\n'}}));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("a quantifier with nothing to repeat");
    if (c == '^' || c == '$') fail("an anchor inside the pattern");
    if (c == '\\') {
      std::vector<codepoint_range> ranges;
      parse_escape(ranges, /*in_class=*/false);
      return char_node(std::move(ranges));
    }
    const uint32_t cp = next_char();
    return char_node({{cp, cp}});
  }

  uint32_t read_hex(int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      if (at_end() || !std::isxdigit(static_cast<unsigned char>(peek())))
        fail("a hex escape needs " + std::to_string(digits) + " hex digits");
      const char h = peek();
      value = value * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      ++pos_;
    }
    return value;
  }

  // After a backslash: appends what the escape matches to `ranges`.
  void parse_escape(std::vector<codepoint_range>& ranges, bool in_class) {
    ++pos_;  // the backslash
    if (at_end()) fail("a pattern that ends in a backslash");
    const char c = peek();
    ++pos_;
    auto add = [&](const std::vector<codepoint_range>& r) { ranges.insert(ranges.end(), r.begin(), r.end()); };
    auto single = [&](uint32_t cp) { ranges.push_back({cp, cp}); };
    switch (c) {
      case 'd': add(digit_ranges); return;
      case 'D': add(complement_ranges(digit_ranges)); return;
      case 'w': add(word_ranges); return;
      case 'W': add(complement_ranges(word_ranges)); return;
      case 's': add(space_ranges); return;
      case 'S': add(complement_ranges(normalize_ranges(space_ranges))); return;
      case 'n': single('\n'); return;
      case 'r': single('\r'); return;
      case 't': single('\t'); return;
      case 'f': single('\f'); return;
      case 'v': single('\v'); return;
      case '0': single(0); return;
      case 'x':
        if (!at_end() && peek() == '{') {
          ++pos_;
          uint32_t value = 0;
          int n = 0;
          while (!at_end() && peek() != '}') {
            value = value * 16 + read_hex(1);
            if (++n > 6 || value > max_codepoint) fail("a \\x{...} escape beyond U+10FFFF");
          }
          if (at_end() || n == 0) fail("a \\x{ without its hex digits and '}'");
          ++pos_;
          single(value);
        } else {
          single(read_hex(2));
        }
        return;
      case 'u': single(read_hex(4)); return;
      case 'b':
        if (in_class) {
          single('\b');
          return;
        }
        fail("\\b (word boundaries)");
      case 'B': fail("\\B (word boundaries)");
      default:
        if (c >= '1' && c <= '9') fail("a backreference (\\" + std::string(1, c) + ")");
        if (std::isalnum(static_cast<unsigned char>(c))) fail("the escape \\" + std::string(1, c));
        --pos_;
        single(next_char());  // an escaped punctuation character (or any non-ASCII one) is itself
    }
  }

  int parse_class() {
    ++pos_;  // '['
    bool negate = false;
    if (!at_end() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    std::vector<codepoint_range> ranges;
    bool first = true;
    while (true) {
      if (at_end()) fail("a '[' without its ']'");
      if (peek() == ']' && !first) break;
      first = false;
      std::vector<codepoint_range> item;
      if (peek() == '\\') {
        parse_escape(item, /*in_class=*/true);
      } else {
        const uint32_t cp = next_char();
        item.push_back({cp, cp});
      }
      // A range a-b: only between two single characters; a '-' elsewhere is itself.
      if (item.size() == 1 && item[0].first == item[0].second && pos_ + 1 < text_.size() && peek() == '-' &&
          text_[pos_ + 1] != ']') {
        ++pos_;
        std::vector<codepoint_range> end;
        if (peek() == '\\') {
          parse_escape(end, true);
        } else {
          const uint32_t cp = next_char();
          end.push_back({cp, cp});
        }
        if (end.size() != 1 || end[0].first != end[0].second) fail("a class range whose end is a class");
        if (end[0].first < item[0].first) fail("a class range whose end comes before its start");
        item[0].second = end[0].first;
      }
      ranges.insert(ranges.end(), item.begin(), item.end());
    }
    ++pos_;  // ']'
    ranges = normalize_ranges(std::move(ranges));
    return char_node(negate ? complement_ranges(ranges) : std::move(ranges));
  }

  std::string_view text_;
  size_t pos_ = 0;
  regex_tree tree_;
};

bool is_plain(uint32_t cp) {
  return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_' || cp == ' ' ||
         cp == ',' || cp == ':' || cp == '"' || cp == '-' || cp == '@' || cp == '#' || cp == '%' || cp == '=' ||
         cp == '!' || cp == '~' || cp == '`' || cp == '\'' || cp == ';' || cp == '<' || cp == '>' || cp == '&';
}

std::string escaped_codepoint(uint32_t cp, bool in_class) {
  if (is_plain(cp) && !(in_class && cp == '-')) return std::string(1, static_cast<char>(cp));
  char text[16];
  std::snprintf(text, sizeof text, "\\x{%X}", cp);
  return text;
}

void print_node(const regex_tree& tree, int index, std::string& out) {
  const regex_node& node = tree.nodes[static_cast<size_t>(index)];
  switch (node.kind) {
    case regex_node::type::empty: out += "(?:)"; return;
    case regex_node::type::char_class:
      if (node.ranges.size() == 1 && node.ranges[0].first == node.ranges[0].second) {
        out += escaped_codepoint(node.ranges[0].first, false);
        return;
      }
      if (node.ranges.empty()) {
        out += "[^\\x{0}-\\x{10FFFF}]";
        return;
      }
      out += '[';
      for (const auto& [lo, hi] : node.ranges) {
        out += escaped_codepoint(lo, true);
        if (hi != lo) out += "-" + escaped_codepoint(hi, true);
      }
      out += ']';
      return;
    case regex_node::type::concat:
      out += "(?:";
      for (int child : node.children) print_node(tree, child, out);
      out += ')';
      return;
    case regex_node::type::alternation:
      out += "(?:";
      for (size_t i = 0; i < node.children.size(); ++i) {
        if (i > 0) out += '|';
        print_node(tree, node.children[i], out);
      }
      out += ')';
      return;
    case regex_node::type::repeat:
      out += "(?:";
      print_node(tree, node.children[0], out);
      out += "){" + std::to_string(node.min) + "," + (node.max < 0 ? "" : std::to_string(node.max)) + "}";
      return;
  }
}

}  // namespace

regex_tree parse_regex(std::string_view pattern) { return parser(pattern).parse(); }

std::string print_regex(const regex_tree& tree) {
  std::string out;
  if (tree.root >= 0) print_node(tree, tree.root, out);
  return out;
}

std::vector<codepoint_range> normalize_ranges(std::vector<codepoint_range> ranges) {
  // Surrogates are not characters: UTF-8 cannot carry them.
  std::vector<codepoint_range> split;
  for (auto [lo, hi] : ranges) {
    hi = std::min(hi, max_codepoint);
    if (lo > hi) continue;
    if (lo < surrogate_lo && hi > surrogate_hi) {
      split.push_back({lo, surrogate_lo - 1});
      split.push_back({surrogate_hi + 1, hi});
    } else if (lo >= surrogate_lo && hi <= surrogate_hi) {
      continue;
    } else if (lo >= surrogate_lo && lo <= surrogate_hi) {
      split.push_back({surrogate_hi + 1, hi});
    } else if (hi >= surrogate_lo && hi <= surrogate_hi) {
      split.push_back({lo, surrogate_lo - 1});
    } else {
      split.push_back({lo, hi});
    }
  }
  std::sort(split.begin(), split.end());
  std::vector<codepoint_range> merged;
  for (const auto& r : split) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

std::vector<codepoint_range> complement_ranges(const std::vector<codepoint_range>& ranges) {
  std::vector<codepoint_range> out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : ranges) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= max_codepoint) out.push_back({next, max_codepoint});
  return normalize_ranges(std::move(out));
}

std::vector<codepoint_range> intersect_ranges(const std::vector<codepoint_range>& a,
                                              const std::vector<codepoint_range>& b) {
  std::vector<codepoint_range> out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t lo = std::max(a[i].first, b[j].first);
    const uint32_t hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.push_back({lo, hi});
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

std::string regex_escape(std::string_view text) {
  static const std::string_view special = "\\^$.|?*+()[]{}/";
  std::string out;
  for (char c : text) {
    if (special.find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace troupe
