#include "text/jinja/template.hpp"

#include "text/jinja/builtins.hpp"
#include "text/jinja/interpreter.hpp"
#include "text/jinja/parser.hpp"

namespace troupe {

jinja_template::jinja_template(std::string source) : source_(std::move(source)), program_(parse_template(source_)) {}

std::string jinja_template::render(const std::vector<std::pair<std::string, jinja_value>>& variables) const {
  jinja_scope globals;
  install_globals(globals);
  for (const auto& [name, value] : variables) globals.set(name, value);
  jinja_interpreter interpreter;
  return interpreter.render(*program_, globals);
}

}  // namespace troupe
