#pragma once
// The OpenAI API's ways of asking for structured output, read into one guided_decoding:
// `response_format` ({"type": "text" | "json_object"} or {"type": "json_schema", "json_schema":
// {"name", "schema", "strict", "description"}}) and vLLM's extra fields `guided_json` (a schema,
// as an object or as JSON text), `guided_regex` and `guided_choice`. At most one of them may ask
// for a constraint. The schema keeps the order of its properties as the client wrote them (the
// output lists them in that order): the body is read into ordered JSON.

#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "protocol/sampling_params.hpp"

namespace troupe {

struct guided_field_error {
  std::string param;  // the field as the client named it ("response_format.json_schema.schema")
  std::string problem;
};

struct guided_fields {
  const nlohmann::ordered_json* response_format = nullptr;
  const nlohmann::ordered_json* guided_json = nullptr;
  const nlohmann::ordered_json* guided_regex = nullptr;
  const nlohmann::ordered_json* guided_choice = nullptr;
};

// `param` is set to the field that asked for the constraint (for the doors' error messages).
// Throws guided_field_error.
guided_decoding read_guided_fields(const guided_fields& fields, size_t max_string_bytes, std::string& param);

}  // namespace troupe
