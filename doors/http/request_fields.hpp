#pragma once
// Reading a JSON request body field by field, for the HTTP door's parsers (OpenAI's endpoints,
// Anthropic's messages): each value checked for its type and bounds, a problem thrown as the 400
// naming the field, and the fields nobody took noted as ignored. The body is read into ordered
// JSON: a tool's schema and the arguments of past calls reach the template, and the grammar, in
// the order the client wrote them.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "doors/http/api_error.hpp"

namespace troupe::request_json {

using json = nlohmann::ordered_json;

// Thrown inside a parser only; turned into the api_error at its boundary.
struct parameter_error {
  api_error error;
};

// The body as a JSON object; an error for text that is not JSON, is not an object, or nests
// deeper than max_depth (the bound keeps a body of a million '[' from costing more than its bytes).
std::variant<json, api_error> parse_request_body(std::string_view body, int max_depth);

[[noreturn]] void fail(const std::string& param, const std::string& problem);
const char* type_name(const json& v);
[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json& v);
std::string read_string(const json& v, const std::string& param, size_t max_bytes);
int64_t read_int(const json& v, const std::string& param, int64_t lo, int64_t hi);
bool read_bool(const json& v, const std::string& param);
std::vector<int32_t> read_token_ids(const json& v, const std::string& param, size_t max_count);
// An integer field of sampling_params: the JSON only has to carry a value that fits.
int read_int32(const json& v, const std::string& param);
// A float field of sampling_params. A double beyond float's range becomes an infinity (which
// the value rules refuse) instead of an undefined conversion.
float read_float(const json& v, const std::string& param);

// The fields of an object of the request, taken one by one; what is left over is unknown and
// ignored, its name noted (with `where` before it: "messages[2].x").
class request_fields {
 public:
  request_fields(const json& body, std::vector<std::string>& ignored, std::string where = {});
  request_fields(const request_fields&) = delete;
  ~request_fields() { note_ignored(); }

  // null counts as "not given", as OpenAI's and Anthropic's APIs take it.
  const json* take(const std::string& key);
  // Notes the fields nobody took (the destructor does it too).
  void note_ignored();

 private:
  std::vector<std::pair<std::string, const json*>> fields_;  // in body order; taken ones null
  std::vector<std::string>& ignored_;
  std::string where_;
};

}  // namespace troupe::request_json
