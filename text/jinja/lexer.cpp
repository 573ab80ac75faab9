#include "text/jinja/lexer.hpp"

#include <cctype>
#include <optional>
#include <utility>

#include "text/jinja/error.hpp"
#include "text/jinja/strings.hpp"
#include "text/unicode/utf8.hpp"

namespace troupe {

const char* to_string(jinja_token_type type) {
  switch (type) {
    case jinja_token_type::text: return "Text";
    case jinja_token_type::numeric_literal: return "NumericLiteral";
    case jinja_token_type::string_literal: return "StringLiteral";
    case jinja_token_type::identifier: return "Identifier";
    case jinja_token_type::equals: return "Equals";
    case jinja_token_type::open_paren: return "OpenParen";
    case jinja_token_type::close_paren: return "CloseParen";
    case jinja_token_type::open_statement: return "OpenStatement";
    case jinja_token_type::close_statement: return "CloseStatement";
    case jinja_token_type::open_expression: return "OpenExpression";
    case jinja_token_type::close_expression: return "CloseExpression";
    case jinja_token_type::open_square_bracket: return "OpenSquareBracket";
    case jinja_token_type::close_square_bracket: return "CloseSquareBracket";
    case jinja_token_type::open_curly_bracket: return "OpenCurlyBracket";
    case jinja_token_type::close_curly_bracket: return "CloseCurlyBracket";
    case jinja_token_type::comma: return "Comma";
    case jinja_token_type::dot: return "Dot";
    case jinja_token_type::colon: return "Colon";
    case jinja_token_type::pipe: return "Pipe";
    case jinja_token_type::additive_operator: return "AdditiveBinaryOperator";
    case jinja_token_type::multiplicative_operator: return "MultiplicativeBinaryOperator";
    case jinja_token_type::exponentiation_operator: return "ExponentiationBinaryOperator";
    case jinja_token_type::comparison_operator: return "ComparisonBinaryOperator";
    case jinja_token_type::unary_operator: return "UnaryOperator";
    case jinja_token_type::comment: return "Comment";
  }
  return "Unknown";
}

jinja_source_position locate(std::string_view source, std::size_t offset) {
  jinja_source_position pos{1, 1};
  for (std::size_t i = 0; i < offset && i < source.size(); ++i) {
    const auto c = static_cast<unsigned char>(source[i]);
    if (c == '\n') {
      ++pos.line;
      pos.column = 1;
    } else if ((c & 0xC0) != 0x80) {
      ++pos.column;
    }
  }
  return pos;
}

namespace {

// The preprocessed template, with each byte's offset in the original source so that errors can
// point at what the author wrote.
struct mapped_text {
  std::string text;
  std::vector<std::size_t> origin;

  void push(char c, std::size_t from) {
    text += c;
    origin.push_back(from);
  }
};

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Byte length of the JS whitespace character at `i`, or 0.
std::size_t space_at(const std::string& s, std::size_t i) {
  if (i >= s.size()) return 0;
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return is_ascii_space(static_cast<char>(c)) ? 1 : 0;
  const std::size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
  if (i + len > s.size()) return 0;
  const auto cps = jinja_strings::decode_utf8(std::string_view(s).substr(i, len));
  return cps.size() == 1 && utf8::is_js_whitespace(cps[0]) ? len : 0;
}

// Byte length of the JS whitespace character ending just before `end`, or 0.
std::size_t space_before(const std::string& s, std::size_t end) {
  if (end == 0) return 0;
  std::size_t begin = end - 1;
  while (begin > 0 && utf8::is_continuation_byte(static_cast<unsigned char>(s[begin])) && end - begin < 4) --begin;
  return space_at(s, begin) == end - begin ? end - begin : 0;
}

mapped_text preprocess(std::string_view source) {
  mapped_text in;
  for (std::size_t i = 0; i < source.size(); ++i) in.push(source[i], i);
  // A single trailing newline is not part of the output (Jinja's keep_trailing_newline=False).
  if (!in.text.empty() && in.text.back() == '\n') {
    in.text.pop_back();
    in.origin.pop_back();
  }

  // lstrip_blocks: spaces and tabs from the start of a line up to `{%`, `{#` (or `{-`).
  mapped_text lstripped;
  for (std::size_t i = 0; i < in.text.size();) {
    const bool line_start = i == 0 || in.text[i - 1] == '\n' || in.text[i - 1] == '\r';
    if (line_start) {
      std::size_t j = i;
      while (j < in.text.size() && (in.text[j] == ' ' || in.text[j] == '\t')) ++j;
      if (j + 1 < in.text.size() && in.text[j] == '{' &&
          (in.text[j + 1] == '#' || in.text[j + 1] == '%' || in.text[j + 1] == '-')) {
        i = j;
      }
    }
    lstripped.push(in.text[i], in.origin[i]);
    ++i;
  }

  // trim_blocks: the first newline after `%}`, `#}` (or `-}`).
  mapped_text trimmed;
  const std::string& t = lstripped.text;
  for (std::size_t i = 0; i < t.size(); ++i) {
    trimmed.push(t[i], lstripped.origin[i]);
    if (t[i] == '}' && i > 0 && (t[i - 1] == '#' || t[i - 1] == '%' || t[i - 1] == '-') && i + 1 < t.size() &&
        t[i + 1] == '\n') {
      ++i;  // drop the newline
    }
  }

  // transformers' {% generation %} / {% endgeneration %} markers mark assistant text for
  // training masks; rendering drops them, and the whitespace beside a '-' side with them.
  mapped_text out;
  const std::string& s = trimmed.text;
  std::size_t copied = 0;  // bytes of s already moved to out
  for (std::size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] != '{' || s[i + 1] != '%') continue;
    std::size_t j = i + 2;
    const bool lstrip = j < s.size() && s[j] == '-';
    if (lstrip) ++j;
    while (std::size_t n = space_at(s, j)) j += n;
    if (s.compare(j, 3, "end") == 0 && s.compare(j + 3, 10, "generation") == 0) j += 3;
    if (s.compare(j, 10, "generation") != 0) continue;
    j += 10;
    while (std::size_t n = space_at(s, j)) j += n;
    const bool rstrip = j < s.size() && s[j] == '-';
    if (rstrip) ++j;
    if (s.compare(j, 2, "%}") != 0) continue;
    j += 2;
    std::size_t before = i;
    while (before > copied)
      if (std::size_t n = space_before(s, before))
        before -= n;
      else
        break;
    std::size_t after = j;
    while (std::size_t n = space_at(s, after)) after += n;
    for (std::size_t k = copied; k < before; ++k) out.push(s[k], trimmed.origin[k]);
    if (!lstrip)
      for (std::size_t k = before; k < i; ++k) out.push(s[k], trimmed.origin[k]);
    if (!rstrip)
      for (std::size_t k = j; k < after; ++k) out.push(s[k], trimmed.origin[k]);
    copied = after;
    i = after - 1;
  }
  for (std::size_t k = copied; k < s.size(); ++k) out.push(s[k], trimmed.origin[k]);
  return out;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

class lexer {
 public:
  lexer(std::string_view source, mapped_text src) : source_(source), src_(std::move(src)) {}

  std::vector<jinja_token> run() {
    const std::string& s = src_.text;
    while (pos_ < s.size()) {
      const auto last = tokens_.empty() ? std::optional<jinja_token_type>() : tokens_.back().type;
      if (!last || *last == jinja_token_type::close_statement || *last == jinja_token_type::close_expression ||
          *last == jinja_token_type::comment) {
        const std::size_t start = pos_;
        while (pos_ < s.size() && !(s[pos_] == '{' && pos_ + 1 < s.size() &&
                                    (s[pos_ + 1] == '%' || s[pos_ + 1] == '{' || s[pos_ + 1] == '#'))) {
          ++pos_;
        }
        if (pos_ > start) {
          push(jinja_token_type::text, s.substr(start, pos_ - start), start);
          continue;
        }
      }

      if (s.compare(pos_, 2, "{#") == 0) {
        lex_comment();
        continue;
      }
      if (s.compare(pos_, 3, "{%-") == 0) {
        strip_trailing_whitespace();
        push(jinja_token_type::open_statement, "{%", pos_);
        pos_ += 3;
        continue;
      }
      if (s.compare(pos_, 3, "{{-") == 0) {
        strip_trailing_whitespace();
        push(jinja_token_type::open_expression, "{{", pos_);
        curly_depth_ = 0;
        pos_ += 3;
        continue;
      }

      while (pos_ < s.size() && is_ascii_space(s[pos_])) ++pos_;
      if (pos_ >= s.size()) fail("Unexpected end of input", pos_ - 1);

      if (s.compare(pos_, 3, "-%}") == 0) {
        push(jinja_token_type::close_statement, "%}", pos_);
        pos_ += 3;
        skip_leading_whitespace();
        continue;
      }
      if (s.compare(pos_, 3, "-}}") == 0) {
        push(jinja_token_type::close_expression, "}}", pos_);
        pos_ += 3;
        skip_leading_whitespace();
        continue;
      }

      const char c = s[pos_];
      if ((c == '-' || c == '+') && lex_sign(c)) continue;
      if (lex_operator()) continue;

      if (c == '\'' || c == '"') {
        const std::size_t start = pos_;
        ++pos_;
        std::string value = lex_string_body(c, start);
        push(jinja_token_type::string_literal, std::move(value), start);
        ++pos_;  // closing quote
        continue;
      }
      if (is_digit(c)) {
        const std::size_t start = pos_;
        std::string num = digits();
        const bool after_dot = !tokens_.empty() && tokens_.back().type == jinja_token_type::dot;
        if (!after_dot && pos_ + 1 < s.size() && s[pos_] == '.' && is_digit(s[pos_ + 1])) {
          ++pos_;
          num += "." + digits();
        }
        push(jinja_token_type::numeric_literal, std::move(num), start);
        continue;
      }
      if (is_word(c)) {
        const std::size_t start = pos_;
        while (pos_ < s.size() && is_word(s[pos_])) ++pos_;
        push(jinja_token_type::identifier, s.substr(start, pos_ - start), start);
        continue;
      }
      fail(std::string("Unexpected character: ") + character_at(pos_), pos_);
    }
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(const std::string& what, std::size_t src_pos) const {
    std::size_t offset = source_.size();
    if (src_pos < src_.origin.size()) offset = src_.origin[src_pos];
    const auto p = locate(source_, offset);
    throw jinja_syntax_error(what, p.line, p.column);
  }

  std::string character_at(std::size_t i) const {
    const auto c = static_cast<unsigned char>(src_.text[i]);
    const std::size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    return src_.text.substr(i, len);
  }

  void push(jinja_token_type type, std::string value, std::size_t src_pos) {
    const std::size_t offset = src_pos < src_.origin.size() ? src_.origin[src_pos] : source_.size();
    tokens_.push_back({type, std::move(value), offset});
  }

  void strip_trailing_whitespace() {
    if (tokens_.empty() || tokens_.back().type != jinja_token_type::text) return;
    tokens_.back().value = jinja_strings::trim_end(tokens_.back().value);
    if (tokens_.back().value.empty()) tokens_.pop_back();
  }

  void skip_leading_whitespace() {
    while (std::size_t n = space_at(src_.text, pos_)) pos_ += n;
  }

  void lex_comment() {
    const std::string& s = src_.text;
    const std::size_t start = pos_;
    pos_ += 2;
    const bool strip_before = pos_ < s.size() && s[pos_] == '-';
    if (strip_before) ++pos_;
    std::string comment;
    while (!(pos_ + 1 < s.size() && s[pos_] == '#' && s[pos_ + 1] == '}')) {
      if (pos_ + 2 >= s.size()) fail("Missing end of comment tag", start);
      comment += s[pos_++];
    }
    const bool strip_after = !comment.empty() && comment.back() == '-';
    if (strip_after) comment.pop_back();
    if (strip_before) strip_trailing_whitespace();
    push(jinja_token_type::comment, std::move(comment), start);
    pos_ += 2;
    if (strip_after) skip_leading_whitespace();
  }

  // A '+' or '-' after an operand is binary; elsewhere it is a sign, folded into a number
  // literal when digits follow. Returns false to let the operator table take a binary one.
  bool lex_sign(char c) {
    if (tokens_.empty() || tokens_.back().type == jinja_token_type::text) {
      fail(std::string("Unexpected character: ") + c, pos_);
    }
    switch (tokens_.back().type) {
      case jinja_token_type::identifier:
      case jinja_token_type::numeric_literal:
      case jinja_token_type::string_literal:
      case jinja_token_type::close_paren:
      case jinja_token_type::close_square_bracket: return false;
      default: break;
    }
    const std::size_t start = pos_;
    ++pos_;
    std::string num = digits();
    const std::string& s = src_.text;
    if (!num.empty() && pos_ + 1 < s.size() && s[pos_] == '.' && is_digit(s[pos_ + 1])) {
      ++pos_;
      num += "." + digits();
    }
    push(num.empty() ? jinja_token_type::unary_operator : jinja_token_type::numeric_literal, std::string(1, c) + num,
         start);
    return true;
  }

  bool lex_operator() {
    static const std::pair<const char*, jinja_token_type> table[] = {
        {"{%", jinja_token_type::open_statement},
        {"%}", jinja_token_type::close_statement},
        {"{{", jinja_token_type::open_expression},
        {"}}", jinja_token_type::close_expression},
        {"(", jinja_token_type::open_paren},
        {")", jinja_token_type::close_paren},
        {"{", jinja_token_type::open_curly_bracket},
        {"}", jinja_token_type::close_curly_bracket},
        {"[", jinja_token_type::open_square_bracket},
        {"]", jinja_token_type::close_square_bracket},
        {",", jinja_token_type::comma},
        {".", jinja_token_type::dot},
        {":", jinja_token_type::colon},
        {"|", jinja_token_type::pipe},
        {"<=", jinja_token_type::comparison_operator},
        {">=", jinja_token_type::comparison_operator},
        {"==", jinja_token_type::comparison_operator},
        {"!=", jinja_token_type::comparison_operator},
        {"<", jinja_token_type::comparison_operator},
        {">", jinja_token_type::comparison_operator},
        {"+", jinja_token_type::additive_operator},
        {"-", jinja_token_type::additive_operator},
        {"~", jinja_token_type::additive_operator},
        {"**", jinja_token_type::exponentiation_operator},
        {"*", jinja_token_type::multiplicative_operator},
        {"//", jinja_token_type::multiplicative_operator},
        {"/", jinja_token_type::multiplicative_operator},
        {"%", jinja_token_type::multiplicative_operator},
        {"=", jinja_token_type::equals},
    };
    const std::string& s = src_.text;
    for (const auto& [seq, type] : table) {
      const std::string_view sv(seq);
      // Inside a dict literal "}}" closes two dicts, not the expression.
      if (sv == "}}" && curly_depth_ > 0) continue;
      if (s.compare(pos_, sv.size(), sv) != 0) continue;
      push(type, std::string(sv), pos_);
      if (type == jinja_token_type::open_expression) curly_depth_ = 0;
      if (type == jinja_token_type::open_curly_bracket) ++curly_depth_;
      if (type == jinja_token_type::close_curly_bracket) --curly_depth_;
      pos_ += sv.size();
      return true;
    }
    return false;
  }

  std::string digits() {
    const std::string& s = src_.text;
    const std::size_t start = pos_;
    while (pos_ < s.size() && is_digit(s[pos_])) ++pos_;
    return s.substr(start, pos_ - start);
  }

  std::string lex_string_body(char quote, std::size_t start) {
    const std::string& s = src_.text;
    std::string out;
    while (true) {
      if (pos_ >= s.size()) fail("Unexpected end of input (unterminated string)", start);
      const char c = s[pos_];
      if (c == quote) return out;
      if (c == '\\') {
        ++pos_;
        if (pos_ >= s.size()) fail("Unexpected end of input", start);
        const char e = s[pos_++];
        if (e == 'x' || e == 'u') {
          const std::size_t len = e == 'x' ? 2 : 4;
          const std::string hex = s.substr(pos_, len);
          bool ok = hex.size() == len;
          for (char h : hex) ok = ok && std::isxdigit(static_cast<unsigned char>(h));
          if (!ok) fail(std::string("Invalid hexadecimal escape sequence: \\") + e + hex, pos_ - 2);
          utf8::append(out, static_cast<char32_t>(std::stoul(hex, nullptr, 16)));
          pos_ += len;
          continue;
        }
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'v': out += '\v'; break;
          case '\'': out += '\''; break;
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          default: fail(std::string("Unexpected escaped character: ") + character_at(pos_ - 1), pos_ - 2);
        }
        continue;
      }
      out += c;
      ++pos_;
    }
  }

  std::string_view source_;
  mapped_text src_;
  std::size_t pos_ = 0;
  int curly_depth_ = 0;
  std::vector<jinja_token> tokens_;
};

}  // namespace

std::vector<jinja_token> tokenize(std::string_view source) { return lexer(source, preprocess(source)).run(); }

}  // namespace troupe
