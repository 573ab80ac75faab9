#pragma once

#include <string_view>
#include <vector>

#include "text/jinja/ast.hpp"
#include "text/jinja/lexer.hpp"

namespace troupe {

// Builds the syntax tree of a template. Operator precedence, statement forms and quirks follow
// @huggingface/jinja: `x if c` without else is a filter on loops, tests bind tighter than `*`,
// `not` binds looser than comparisons. Throws jinja_syntax_error naming line and column of the
// offending token in `source`.
jinja_node_ptr parse_template(std::string_view source);

}  // namespace troupe
