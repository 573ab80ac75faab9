#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace troupe {

enum class jinja_node_kind {
  program,          // body
  comment,          //
  text,             // text: literal output between tags
  string_literal,   // text
  integer_literal,  // integer
  float_literal,    // number
  identifier,       // text: the name
  array_literal,    // children: items
  tuple_literal,    // children: items
  object_literal,   // children: key0, value0, key1, value1, ...
  if_statement,     // children[0]: test; body; alternate (an elif is one nested if)
  for_statement,    // children[0]: loop variable (identifier or tuple), children[1]: iterable; body;
                    // alternate: the {% else %} block run when nothing was iterated
  set_statement,    // children[0]: target, children[1]: value or null for {% set x %}...{% endset %}; body
  macro,            // text: name; children: parameters (identifier or keyword_argument); body
  break_statement,
  continue_statement,
  filter_statement,  // children[0]: filter (identifier or call); body
  member,            // children[0]: object, children[1]: property; flag: computed (obj[expr])
  call,              // children[0]: callee, children[1..]: arguments
  binary,            // text: operator; children: left, right
  unary,             // text: operator ("not", "-", "+"); children[0]: operand
  filter,            // children[0]: operand, children[1]: filter (identifier or call)
  test,              // children[0]: operand; text: test name; flag: negated (is not)
  select,            // children[0]: value, children[1]: condition (`x if c` without else)
  ternary,           // children: condition, value if true, value if false
  slice,             // children: start, stop, step (each may be null)
  keyword_argument,  // text: name; children[0]: value
};

struct jinja_node;
using jinja_node_ptr = std::unique_ptr<jinja_node>;

// One node of a parsed template. A single shape for every kind keeps the parser and the
// interpreter small; the comments above say which fields each kind uses.
struct jinja_node {
  jinja_node_kind kind;
  std::size_t offset = 0;  // byte offset in the template source
  std::string text;
  std::int64_t integer = 0;
  double number = 0.0;
  bool flag = false;
  std::vector<jinja_node_ptr> children;
  std::vector<jinja_node_ptr> body;
  std::vector<jinja_node_ptr> alternate;

  jinja_node(jinja_node_kind k, std::size_t off) : kind(k), offset(off) {}
  const jinja_node* child(std::size_t i) const { return i < children.size() ? children[i].get() : nullptr; }
};

}  // namespace troupe
