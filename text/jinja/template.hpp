#pragma once

#include <string>
#include <utility>
#include <vector>

#include "text/jinja/ast.hpp"
#include "text/jinja/value.hpp"

namespace troupe {

// A template parsed once and rendered many times. Rendering is const and keeps no state between
// calls, so one template may render on several threads at once.
class jinja_template {
 public:
  // Throws jinja_syntax_error ("jinja syntax error at LINE:COLUMN: ...") when it cannot parse.
  explicit jinja_template(std::string source);

  // Renders with these variables on top of the globals (true, none, namespace, range,
  // raise_exception, strftime_now, ...). Throws jinja_runtime_error on a rendering error.
  std::string render(const std::vector<std::pair<std::string, jinja_value>>& variables) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  jinja_node_ptr program_;
};

}  // namespace troupe
