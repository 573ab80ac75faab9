#pragma once

#include <stdexcept>
#include <string>

namespace troupe {

// A template that cannot be parsed: the message names line and column (1-based, counted in
// Unicode code points) of the offending spot in the original template source.
class jinja_syntax_error : public std::runtime_error {
 public:
  jinja_syntax_error(const std::string& what, int line, int column)
      : std::runtime_error("jinja syntax error at " + std::to_string(line) + ":" + std::to_string(column) + ": " +
                           what),
        line_(line),
        column_(column) {}
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  int line_;
  int column_;
};

// A failure while rendering: an unknown filter, an operation on undefined values, or a template
// calling raise_exception(). The message mirrors @huggingface/jinja's, so that what a client sees
// is what the Hugging Face stack would have told it.
class jinja_runtime_error : public std::runtime_error {
 public:
  explicit jinja_runtime_error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace troupe
