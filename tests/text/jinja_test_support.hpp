#pragma once

// Shared by the Jinja tests: render a template with a JSON context in C++, catching errors the
// same way the oracle script does, so both sides can be compared result for result.
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/text/jinja_oracle.hpp"
#include "text/jinja/template.hpp"

namespace troupe::testing {

inline jinja_oracle_result render_in_cpp(const std::string& source, const nlohmann::ordered_json& context) {
  jinja_oracle_result result;
  try {
    const jinja_template t(source);
    std::vector<std::pair<std::string, jinja_value>> variables;
    for (auto it = context.begin(); it != context.end(); ++it)
      variables.emplace_back(it.key(), jinja_value::from_json(it.value()));
    result.output = t.render(variables);
    result.ok = true;
  } catch (const std::exception& e) {
    result.output = e.what();
  }
  return result;
}

// A line that shows where two renderings part, with the bytes around it.
inline std::string first_difference(const std::string& a, const std::string& b) {
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  auto around = [&](const std::string& s) {
    const std::size_t from = i >= 40 ? i - 40 : 0;
    return nlohmann::json(s.substr(from, 80)).dump();
  };
  return "first difference at byte " + std::to_string(i) + ": troupe " + around(a) + " vs reference " + around(b);
}

}  // namespace troupe::testing
