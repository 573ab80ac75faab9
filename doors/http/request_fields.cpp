#include "doors/http/request_fields.hpp"

#include <cmath>
#include <limits>

namespace troupe::request_json {

std::variant<json, api_error> parse_request_body(std::string_view body, int max_depth) {
  json root;
  try {
    json::parser_callback_t within_depth = [max_depth](int depth, json::parse_event_t, json&) {
      if (depth > max_depth) {
        throw parameter_error{
            bad_parameter("", "the request body nests deeper than " + std::to_string(max_depth) + " levels")};
      }
      return true;
    };
    root = json::parse(body.begin(), body.end(), within_depth);
  } catch (const parameter_error& e) {
    return e.error;
  } catch (const json::exception& e) {
    api_error error;
    error.message = std::string("the request body is not valid JSON: ") + e.what();
    return error;
  }
  if (!root.is_object()) {
    api_error error;
    error.message = std::string("the request body must be a JSON object, got ") + type_name(root);
    return error;
  }
  return root;
}

[[noreturn]] void fail(const std::string& param, const std::string& problem) {
  throw parameter_error{bad_parameter(param, "'" + param + "': " + problem)};
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "something else";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json& v) {
  fail(param, std::string("expected ") + expected + ", got " + type_name(v));
}

std::string read_string(const json& v, const std::string& param, size_t max_bytes) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() > max_bytes) fail(param, "longer than " + std::to_string(max_bytes) + " bytes");
  return s;
}

int64_t read_int(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) wrong_type(param, "an integer", v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    fail(param, "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  const int64_t value = v.get<int64_t>();
  if (value < lo || value > hi) {
    fail(param, std::to_string(value) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return value;
}

bool read_bool(const json& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, "a boolean", v);
  return v.get<bool>();
}

std::vector<int32_t> read_token_ids(const json& v, const std::string& param, size_t max_count) {
  if (!v.is_array()) wrong_type(param, "an array of token ids", v);
  if (v.size() > max_count) fail(param, "more than " + std::to_string(max_count) + " token ids");
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    ids.push_back(static_cast<int32_t>(
        read_int(v[i], param + "[" + std::to_string(i) + "]", 0, std::numeric_limits<int32_t>::max())));
  }
  return ids;
}

// An integer field of sampling_params: the JSON only has to carry a value that fits.
int read_int32(const json& v, const std::string& param) {
  if (!v.is_number_integer()) wrong_type(param, "an integer", v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    fail(param, std::to_string(v.get<uint64_t>()) + " does not fit in a 32-bit integer");
  }
  const int64_t value = v.get<int64_t>();
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
    fail(param, std::to_string(value) + " does not fit in a 32-bit integer");
  }
  return static_cast<int>(value);
}

// A float field of sampling_params. A double beyond float's range becomes an infinity (which
// the value rules refuse) instead of an undefined conversion.
float read_float(const json& v, const std::string& param) {
  if (!v.is_number()) wrong_type(param, "a number", v);
  const double value = v.get<double>();
  constexpr float infinity = std::numeric_limits<float>::infinity();
  if (std::fabs(value) > std::numeric_limits<float>::max()) return value > 0 ? infinity : -infinity;
  return static_cast<float>(value);
}

request_fields::request_fields(const json& body, std::vector<std::string>& ignored, std::string where)
    : ignored_(ignored), where_(std::move(where)) {
  for (auto it = body.begin(); it != body.end(); ++it) fields_.emplace_back(it.key(), &it.value());
}

const json* request_fields::take(const std::string& key) {
  for (auto& [name, value] : fields_) {
    if (name != key || !value) continue;
    const json* v = std::exchange(value, nullptr);
    return v->is_null() ? nullptr : v;
  }
  return nullptr;
}

void request_fields::note_ignored() {
  for (auto& [key, value] : fields_) {
    if (value) ignored_.push_back(where_.empty() ? key : where_ + "." + key);
    value = nullptr;
  }
}

}  // namespace troupe::request_json
