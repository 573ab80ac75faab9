#pragma once
// Why a constraint (JSON schema, regular expression, choice) cannot be compiled. The message
// names the part that is wrong or unsupported ("$.properties.age: minimum 5 is above maximum 3"),
// so that a door can hand it to the client as it is.

#include <stdexcept>
#include <string>

namespace troupe {

class grammar_error : public std::runtime_error {
 public:
  explicit grammar_error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace troupe
