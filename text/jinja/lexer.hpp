#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

enum class jinja_token_type {
  text,
  numeric_literal,
  string_literal,
  identifier,
  equals,
  open_paren,
  close_paren,
  open_statement,
  close_statement,
  open_expression,
  close_expression,
  open_square_bracket,
  close_square_bracket,
  open_curly_bracket,
  close_curly_bracket,
  comma,
  dot,
  colon,
  pipe,
  additive_operator,        // + - ~
  multiplicative_operator,  // * / // %
  exponentiation_operator,  // **
  comparison_operator,      // < > <= >= == !=
  unary_operator,           // a sign not followed by digits
  comment,
};

const char* to_string(jinja_token_type type);

struct jinja_token {
  jinja_token_type type;
  std::string value;
  std::size_t offset;  // byte offset in the original source, for error positions
};

// 1-based line and column (in code points) of a byte offset of `source`.
struct jinja_source_position {
  int line;
  int column;
};
jinja_source_position locate(std::string_view source, std::size_t offset);

// Splits a template into tokens the way Hugging Face chat templates are read: trim_blocks and
// lstrip_blocks on, a single trailing newline dropped, `{%-`/`-%}` whitespace control, and
// transformers' {% generation %} tags removed. Throws jinja_syntax_error naming line and column.
std::vector<jinja_token> tokenize(std::string_view source);

}  // namespace troupe
