#include "text/jinja/value.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "text/jinja/error.hpp"
#include "text/jinja/strings.hpp"

namespace troupe {

const jinja_value* jinja_object::find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

jinja_value* jinja_object::find(const std::string& key) {
  return const_cast<jinja_value*>(std::as_const(*this).find(key));
}

void jinja_object::set(const std::string& key, jinja_value value) {
  if (jinja_value* existing = find(key)) {
    *existing = std::move(value);
  } else {
    entries.emplace_back(key, std::move(value));
  }
}

const jinja_value* jinja_call_args::kwarg(const std::string& name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

jinja_value jinja_value::none() { return {jinja_kind::none, std::monostate{}}; }
jinja_value jinja_value::boolean(bool b) { return {jinja_kind::boolean, b}; }
jinja_value jinja_value::integer(std::int64_t i) { return {jinja_kind::integer, i}; }
jinja_value jinja_value::floating(double f) { return {jinja_kind::floating, f}; }
jinja_value jinja_value::string(std::string s) { return {jinja_kind::string, std::move(s)}; }

jinja_value jinja_value::array(jinja_array items) {
  return {jinja_kind::array, std::make_shared<jinja_array>(std::move(items))};
}

// A tuple and a namespace share an array's and an object's representation; only the kind differs.
jinja_value jinja_value::tuple(jinja_array items) {
  return {jinja_kind::tuple, std::make_shared<jinja_array>(std::move(items))};
}

jinja_value jinja_value::object(jinja_object fields) {
  return {jinja_kind::object, std::make_shared<jinja_object>(std::move(fields))};
}

jinja_value jinja_value::ns(jinja_object fields) {
  return {jinja_kind::ns, std::make_shared<jinja_object>(std::move(fields))};
}

jinja_value jinja_value::function(jinja_function fn) {
  return {jinja_kind::function, std::make_shared<jinja_function>(std::move(fn))};
}

namespace {

template <typename Json>
jinja_value convert_json(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return jinja_value::none();
    case nlohmann::json::value_t::boolean: return jinja_value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return jinja_value::integer(j.template get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) return jinja_value::floating(static_cast<double>(u));
      return jinja_value::integer(static_cast<std::int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: {
      const double d = j.template get<double>();
      // JSON.parse has one number type: whole values become the reference's IntegerValue.
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
        return jinja_value::integer(static_cast<std::int64_t>(d));
      }
      return jinja_value::floating(d);
    }
    case nlohmann::json::value_t::string: return jinja_value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      jinja_array items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(convert_json(item));
      return jinja_value::array(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      jinja_object fields;
      fields.entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) fields.entries.emplace_back(it.key(), convert_json(it.value()));
      return jinja_value::object(std::move(fields));
    }
    default: throw std::invalid_argument("jinja: cannot convert a binary JSON value to a template value");
  }
}

}  // namespace

jinja_value jinja_value::from_json(const nlohmann::json& j) { return convert_json(j); }
jinja_value jinja_value::from_json(const nlohmann::ordered_json& j) { return convert_json(j); }

double jinja_value::as_number() const {
  switch (kind_) {
    case jinja_kind::integer: return static_cast<double>(as_int());
    case jinja_kind::floating: return std::get<double>(data_);
    case jinja_kind::boolean: return as_bool() ? 1.0 : 0.0;
    default: throw jinja_runtime_error("Expected a number, got " + type_name());
  }
}

bool jinja_value::truthy() const {
  switch (kind_) {
    case jinja_kind::undefined:
    case jinja_kind::none: return false;
    case jinja_kind::boolean: return as_bool();
    case jinja_kind::integer: return as_int() != 0;
    case jinja_kind::floating: {
      const double d = std::get<double>(data_);
      return d != 0 && !std::isnan(d);
    }
    case jinja_kind::string: return !as_string().empty();
    case jinja_kind::array:
    case jinja_kind::tuple: return !items().empty();
    case jinja_kind::object: return !fields().entries.empty();
    case jinja_kind::ns:
    case jinja_kind::function: return true;
  }
  return false;
}

std::string jinja_value::type_name() const {
  switch (kind_) {
    case jinja_kind::undefined: return "UndefinedValue";
    case jinja_kind::none: return "NullValue";
    case jinja_kind::boolean: return "BooleanValue";
    case jinja_kind::integer: return "IntegerValue";
    case jinja_kind::floating: return "FloatValue";
    case jinja_kind::string: return "StringValue";
    case jinja_kind::array: return "ArrayValue";
    case jinja_kind::tuple: return "TupleValue";
    case jinja_kind::object: return "ObjectValue";
    case jinja_kind::ns: return "NamespaceValue";
    case jinja_kind::function: return "FunctionValue";
  }
  return "UnknownValue";
}

std::string jinja_value::to_output() const {
  switch (kind_) {
    case jinja_kind::undefined: return "undefined";
    case jinja_kind::none: return "null";
    case jinja_kind::boolean: return as_bool() ? "true" : "false";
    case jinja_kind::integer: return std::to_string(as_int());
    case jinja_kind::floating: {
      const double d = std::get<double>(data_);
      if (d == 0 && std::signbit(d)) return "-0.0";
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e21) return jinja_strings::js_number(d) + ".0";
      return jinja_strings::js_number(d);
    }
    case jinja_kind::string: return as_string();
    case jinja_kind::array:
    case jinja_kind::tuple:
    case jinja_kind::object:
    case jinja_kind::ns: {
      jinja_json_options options;
      options.undefined_as_null = false;
      return to_json(*this, options);
    }
    case jinja_kind::function: return "[function]";
  }
  return {};
}

std::string jinja_value::to_concat() const {
  switch (kind_) {
    case jinja_kind::floating: return jinja_strings::js_number(std::get<double>(data_));
    case jinja_kind::array:
    case jinja_kind::tuple: {
      std::string out;
      bool first = true;
      for (const auto& item : items()) {
        if (!first) out += ',';
        first = false;
        out += item.to_output();
      }
      return out;
    }
    case jinja_kind::object:
    case jinja_kind::ns: return "[object Map]";
    default: return to_output();
  }
}

bool jinja_value::strict_equals(const jinja_value& other) const {
  const bool numeric = is_number() && other.is_number();
  if (numeric) return as_number() == other.as_number();
  if (kind_ != other.kind_) {
    // Arrays and tuples are one JavaScript type, objects and namespaces are not.
    if (!(is_array() && other.is_array())) return false;
  }
  switch (kind_) {
    case jinja_kind::undefined:
    case jinja_kind::none: return true;
    case jinja_kind::boolean: return as_bool() == other.as_bool();
    case jinja_kind::string: return as_string() == other.as_string();
    case jinja_kind::array:
    case jinja_kind::tuple:
      return std::get<std::shared_ptr<jinja_array>>(data_) == std::get<std::shared_ptr<jinja_array>>(other.data_);
    case jinja_kind::object:
    case jinja_kind::ns:
      return std::get<std::shared_ptr<jinja_object>>(data_) == std::get<std::shared_ptr<jinja_object>>(other.data_);
    case jinja_kind::function:
      return std::get<std::shared_ptr<jinja_function>>(data_) == std::get<std::shared_ptr<jinja_function>>(other.data_);
    default: return false;
  }
}

namespace {

// ECMAScript StringToNumber, enough for the comparisons templates make.
double js_string_to_number(const std::string& s) {
  const std::string t = jinja_strings::trim(s);
  if (t.empty()) return 0.0;
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nan("");
  return d;
}

bool is_primitive_numeric(const jinja_value& v) {
  return v.is_number() || v.kind() == jinja_kind::boolean || v.is_string();
}

double primitive_to_number(const jinja_value& v) {
  if (v.is_string()) return js_string_to_number(v.as_string());
  return v.as_number();
}

}  // namespace

bool jinja_value::loose_equals(const jinja_value& other) const {
  const bool nullish = kind_ == jinja_kind::undefined || kind_ == jinja_kind::none;
  const bool other_nullish = other.kind_ == jinja_kind::undefined || other.kind_ == jinja_kind::none;
  if (nullish || other_nullish) return nullish && other_nullish;
  if (kind_ == other.kind_ || (is_number() && other.is_number())) return strict_equals(other);
  if (is_primitive_numeric(*this) && is_primitive_numeric(other)) {
    return primitive_to_number(*this) == primitive_to_number(other);
  }
  return false;
}

namespace {

void append_json(std::string& out, const jinja_value& value, const jinja_json_options& options, int depth) {
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  const bool pretty = options.indent.has_value() && *options.indent > 0;
  if (options.separators) {
    item_separator = options.separators->first;
    key_separator = options.separators->second;
  } else if (pretty) {
    item_separator = ",";
  }
  switch (value.kind()) {
    case jinja_kind::undefined: out += options.undefined_as_null ? "null" : "undefined"; return;
    case jinja_kind::none: out += "null"; return;
    case jinja_kind::boolean: out += value.as_bool() ? "true" : "false"; return;
    case jinja_kind::integer: out += std::to_string(value.as_int()); return;
    case jinja_kind::floating: {
      const double d = value.as_number();
      out += std::isfinite(d) ? jinja_strings::js_number(d) : "null";
      return;
    }
    case jinja_kind::string: out += jinja_strings::json_quote(value.as_string(), options.ensure_ascii); return;
    case jinja_kind::tuple: throw jinja_runtime_error("Cannot convert to JSON: TupleValue");  // as the reference
    case jinja_kind::array:
    case jinja_kind::object:
    case jinja_kind::ns: {
      const std::string unit = pretty ? std::string(*options.indent, ' ') : std::string();
      std::string base_padding = "\n";
      for (int i = 0; i < depth; ++i) base_padding += unit;
      const std::string child_padding = base_padding + unit;
      if (value.is_array()) {
        const auto& items = value.items();
        out += '[';
        for (std::size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out += item_separator;
          if (pretty) out += child_padding;
          append_json(out, items[i], options, depth + 1);
        }
        if (pretty && !items.empty()) out += base_padding;
        out += ']';
        return;
      }
      std::vector<const std::pair<std::string, jinja_value>*> entries;
      for (const auto& entry : value.fields().entries) entries.push_back(&entry);
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (std::size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_separator;
        if (pretty) out += child_padding;
        out += jinja_strings::json_quote(entries[i]->first, options.ensure_ascii);
        out += key_separator;
        append_json(out, entries[i]->second, options, depth + 1);
      }
      if (pretty && !entries.empty()) out += base_padding;
      out += '}';
      return;
    }
    case jinja_kind::function: throw jinja_runtime_error("Cannot convert to JSON: FunctionValue");
  }
}

}  // namespace

std::string to_json(const jinja_value& value, const jinja_json_options& options, int depth) {
  std::string out;
  append_json(out, value, options, depth);
  return out;
}

}  // namespace troupe
