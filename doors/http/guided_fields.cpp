#include "doors/http/guided_fields.hpp"

namespace troupe {

namespace {

[[noreturn]] void fail(const std::string& param, const std::string& problem) {
  throw guided_field_error{param, "'" + param + "': " + problem};
}

// The schema's text, its keys in the client's order.
std::string schema_text(const nlohmann::ordered_json& schema) {
  return schema.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

guided_decoding read_guided_fields(const guided_fields& f, size_t max_string_bytes, std::string& param) {
  guided_decoding g;
  int num_asked = 0;
  if (const nlohmann::ordered_json* v = f.response_format) {
    if (!v->is_object() || !v->contains("type") || !(*v)["type"].is_string()) {
      fail("response_format", "expected an object with a \"type\": \"text\", \"json_object\" or \"json_schema\"");
    }
    const std::string type = (*v)["type"].get<std::string>();
    if (type == "json_object") {
      g.kind = guided_kind::json_object;
      param = "response_format";
      ++num_asked;
    } else if (type == "json_schema") {
      const auto it = v->find("json_schema");
      if (it == v->end() || !it->is_object())
        fail("response_format.json_schema", "missing (an object with \"schema\")");
      for (const auto& [key, value] : it->items()) {
        if (key != "name" && key != "schema" && key != "strict" && key != "description") {
          fail("response_format.json_schema." + key, "unrecognized field");
        }
      }
      if (it->contains("strict") && !(*it)["strict"].is_boolean()) {
        fail("response_format.json_schema.strict", "expected a boolean");
      }
      if (!it->contains("schema")) fail("response_format.json_schema.schema", "missing");
      if (!(*it)["schema"].is_object() && !(*it)["schema"].is_boolean()) {
        fail("response_format.json_schema.schema", "expected a JSON schema (an object)");
      }
      g.kind = guided_kind::json_schema;
      g.source = schema_text((*it)["schema"]);
      param = "response_format";
      ++num_asked;
    } else if (type != "text") {
      fail("response_format.type", "\"" + type + "\" is not one of \"text\", \"json_object\", \"json_schema\"");
    }
  }
  if (const nlohmann::ordered_json* v = f.guided_json) {
    g.kind = guided_kind::json_schema;
    if (v->is_string()) {
      g.source = v->get<std::string>();
    } else if (v->is_object()) {
      g.source = schema_text(*v);
    } else {
      fail("guided_json", "expected a JSON schema (an object, or its text)");
    }
    param = "guided_json";
    ++num_asked;
  }
  if (const nlohmann::ordered_json* v = f.guided_regex) {
    if (!v->is_string()) fail("guided_regex", "expected a string");
    g.kind = guided_kind::regex;
    g.source = v->get<std::string>();
    param = "guided_regex";
    ++num_asked;
  }
  if (const nlohmann::ordered_json* v = f.guided_choice) {
    if (!v->is_array()) fail("guided_choice", "expected an array of strings");
    g.kind = guided_kind::choice;
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) fail("guided_choice[" + std::to_string(i) + "]", "expected a string");
      if ((*v)[i].get_ref<const std::string&>().size() > max_string_bytes) {
        fail("guided_choice[" + std::to_string(i) + "]", "longer than " + std::to_string(max_string_bytes) + " bytes");
      }
      g.choices.push_back((*v)[i].get<std::string>());
    }
    param = "guided_choice";
    ++num_asked;
  }
  if (num_asked > 1) {
    fail(param,
         "give only one of response_format (json_object / json_schema), guided_json, guided_regex and guided_choice");
  }
  return g;
}

}  // namespace troupe
