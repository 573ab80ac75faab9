// The filters of jinja_interpreter (`value | name` and `value | name(args)`), with the set of
// filters, their argument handling and their error messages of @huggingface/jinja.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "text/jinja/builtins.hpp"
#include "text/jinja/error.hpp"
#include "text/jinja/interpreter.hpp"
#include "text/jinja/strings.hpp"

namespace troupe {

namespace {

using nk = jinja_node_kind;
namespace js = jinja_strings;

// JavaScript parseInt(s, 10) / parseFloat(s): leading whitespace, then the longest numeric prefix.
bool js_parse_int(const std::string& s, std::int64_t& out) {
  const std::string t = js::trim_start(s);
  char* end = nullptr;
  const long long v = std::strtoll(t.c_str(), &end, 10);
  if (end == t.c_str()) return false;
  out = v;
  return true;
}

bool js_parse_float(const std::string& s, double& out) {
  const std::string t = js::trim_start(s);
  // strtod also reads hex and "inf"/"nan" spellings that parseFloat does not; accept digits only.
  if (t.empty() || !(std::isdigit(static_cast<unsigned char>(t[0])) || t[0] == '.' || t[0] == '-' || t[0] == '+')) {
    return t.rfind("Infinity", 0) == 0 ? (out = INFINITY, true) : false;
  }
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end == t.c_str()) return false;
  out = v;
  return true;
}

std::string indent_lines(const std::string& text, const std::string& indent, bool first, bool blank) {
  std::string out;
  std::size_t start = 0;
  bool is_first = true;
  while (true) {
    const std::size_t nl = text.find('\n', start);
    const std::string line = text.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if (!is_first) out += '\n';
    const bool skip = (!first && is_first) || (!blank && line.empty());
    if (!skip) out += indent;
    out += line;
    is_first = false;
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return out;
}

// Array.prototype.join over raw values: null and undefined join as empty strings.
std::string join_values(const jinja_array& items, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    if (!items[i].is_none() && !items[i].is_undefined()) out += items[i].to_concat();
  }
  return out;
}

jinja_value attribute_path(const jinja_value& item, const std::string& path) {
  jinja_value value = item;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (value.is_attribute_container()) {
      const jinja_value* found = value.fields().find(part);
      value = found ? *found : jinja_value();
    } else if (value.is_array()) {
      char* end = nullptr;
      const long idx = std::strtol(part.c_str(), &end, 10);
      if (end == part.c_str() || idx < 0 || static_cast<std::size_t>(idx) >= value.items().size()) return {};
      value = value.items()[static_cast<std::size_t>(idx)];
    } else {
      return {};
    }
    if (dot == std::string::npos) return value;
    start = dot + 1;
  }
}

jinja_value positional_or(const jinja_call_args& args, std::size_t i, const char* keyword, jinja_value fallback) {
  if (i < args.positional.size()) return args.positional[i];
  if (const jinja_value* v = args.kwarg(keyword)) return *v;
  return fallback;
}

}  // namespace

jinja_value jinja_interpreter::apply_filter(const jinja_value& operand, const jinja_node& filter, jinja_scope& scope) {
  if (filter.kind == nk::identifier) return apply_plain_filter(operand, filter.text);
  if (filter.kind == nk::call) return apply_call_filter(operand, filter, scope);
  throw jinja_runtime_error("Unknown filter node");
}

jinja_value jinja_interpreter::apply_plain_filter(const jinja_value& operand, const std::string& name) {
  if (name == "safe") return operand;
  if (name == "tojson") return jinja_value::string(to_json(operand, {}));

  if (operand.is_array()) {
    const auto& items = operand.items();
    if (name == "list") return operand;
    if (name == "first") return items.empty() ? jinja_value() : items.front();
    if (name == "last") return items.empty() ? jinja_value() : items.back();
    if (name == "length") return jinja_value::integer(static_cast<std::int64_t>(items.size()));
    if (name == "reverse") return jinja_value::array(jinja_array(items.rbegin(), items.rend()));
    if (name == "sort") {
      jinja_array sorted = items;
      std::stable_sort(sorted.begin(), sorted.end(),
                       [](const jinja_value& a, const jinja_value& b) { return compare_values(a, b, false) < 0; });
      return jinja_value::array(std::move(sorted));
    }
    if (name == "join") return jinja_value::string(join_values(items, ""));
    if (name == "string") {
      jinja_json_options options;
      options.undefined_as_null = false;
      return jinja_value::string(to_json(operand, options));
    }
    if (name == "unique") {
      jinja_array out;
      for (const auto& item : items)
        if (std::none_of(out.begin(), out.end(), [&](const jinja_value& seen) { return seen.strict_equals(item); }))
          out.push_back(item);
      return jinja_value::array(std::move(out));
    }
    throw jinja_runtime_error("Unknown ArrayValue filter: " + name);
  }
  if (operand.is_string()) {
    const std::string& s = operand.as_string();
    if (name == "length") return member_builtin(operand, "length");
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      return member_builtin(operand, name).callable()({});
    }
    if (name == "trim") return jinja_value::string(js::trim(s));
    if (name == "indent") return jinja_value::string(indent_lines(s, "    ", false, false));
    if (name == "join" || name == "string") return operand;
    if (name == "int") {
      std::int64_t v = 0;
      return jinja_value::integer(js_parse_int(s, v) ? v : 0);
    }
    if (name == "float") {
      double v = 0;
      return jinja_value::floating(js_parse_float(s, v) ? v : 0.0);
    }
    throw jinja_runtime_error("Unknown StringValue filter: " + name);
  }
  if (operand.is_number()) {
    const bool is_int = operand.kind() == jinja_kind::integer;
    if (name == "abs") {
      return is_int ? jinja_value::integer(std::llabs(operand.as_int()))
                    : jinja_value::floating(std::fabs(operand.as_number()));
    }
    if (name == "int")
      return is_int ? operand : jinja_value::integer(static_cast<std::int64_t>(std::floor(operand.as_number())));
    if (name == "float") return jinja_value::floating(operand.as_number());
    if (name == "string") return jinja_value::string(operand.to_output());
    throw jinja_runtime_error("Unknown NumericValue filter: " + name);
  }
  if (operand.is_object()) {
    if (name == "items") return member_builtin(operand, "items").callable()({});
    if (name == "length") return jinja_value::integer(static_cast<std::int64_t>(operand.fields().entries.size()));
    const jinja_value builtin = member_builtin(operand, name);
    if (builtin.kind() == jinja_kind::function) return builtin.callable()({});
    if (!builtin.is_undefined()) return builtin;
    throw jinja_runtime_error("Unknown ObjectValue filter: " + name);
  }
  if (operand.kind() == jinja_kind::boolean) {
    const bool b = operand.as_bool();
    if (name == "bool") return operand;
    if (name == "int") return jinja_value::integer(b ? 1 : 0);
    if (name == "float") return jinja_value::floating(b ? 1.0 : 0.0);
    if (name == "string") return jinja_value::string(b ? "true" : "false");
    throw jinja_runtime_error("Unknown BooleanValue filter: " + name);
  }
  throw jinja_runtime_error("Cannot apply filter \"" + name + "\" to type: " + operand.type_name());
}

jinja_value jinja_interpreter::apply_call_filter(const jinja_value& operand, const jinja_node& call,
                                                 jinja_scope& scope) {
  const jinja_node& callee = *call.children[0];
  if (callee.kind != nk::identifier) throw jinja_runtime_error("Unknown filter: expected a name");
  const std::string& name = callee.text;

  if (name == "tojson") {
    const jinja_call_args args = evaluate_arguments(call.children, 1, scope);
    jinja_json_options options;
    if (const jinja_value* indent = args.kwarg("indent"); indent && !indent->is_none()) {
      if (indent->kind() != jinja_kind::integer) throw jinja_runtime_error("If set, indent must be a number");
      options.indent = static_cast<int>(indent->as_int());
    }
    if (const jinja_value* v = args.kwarg("ensure_ascii")) {
      if (v->kind() != jinja_kind::boolean) throw jinja_runtime_error("If set, ensure_ascii must be a boolean");
      options.ensure_ascii = v->as_bool();
    }
    if (const jinja_value* v = args.kwarg("sort_keys")) {
      if (v->kind() != jinja_kind::boolean) throw jinja_runtime_error("If set, sort_keys must be a boolean");
      options.sort_keys = v->as_bool();
    }
    if (const jinja_value* v = args.kwarg("separators"); v && !v->is_none()) {
      if (!v->is_array()) throw jinja_runtime_error("If set, separators must be a tuple of two strings");
      const auto& parts = v->items();
      if (parts.size() != 2 || !parts[0].is_string() || !parts[1].is_string()) {
        throw jinja_runtime_error("separators must be a tuple of two strings");
      }
      options.separators = std::make_pair(parts[0].as_string(), parts[1].as_string());
    }
    return jinja_value::string(to_json(operand, options));
  }
  if (name == "join") {
    jinja_array values;
    if (operand.is_string()) {
      const auto cps = js::decode_utf8(operand.as_string());
      for (std::size_t i = 0; i < cps.size(); ++i)
        values.push_back(jinja_value::string(js::encode_utf8(cps, i, i + 1)));
    } else if (operand.is_array()) {
      values = operand.items();
    } else {
      throw jinja_runtime_error("Cannot apply filter \"join\" to type: " + operand.type_name());
    }
    const jinja_call_args args = evaluate_arguments(call.children, 1, scope);
    const jinja_value separator = positional_or(args, 0, "separator", jinja_value::string(""));
    if (!separator.is_string()) throw jinja_runtime_error("separator must be a string");
    return jinja_value::string(join_values(values, separator.as_string()));
  }
  if (name == "int" || name == "float") {
    const jinja_call_args args = evaluate_arguments(call.children, 1, scope);
    const jinja_value fallback =
        positional_or(args, 0, "default", name == "int" ? jinja_value::integer(0) : jinja_value::floating(0.0));
    if (operand.is_string()) {
      if (name == "int") {
        std::int64_t v = 0;
        return js_parse_int(operand.as_string(), v) ? jinja_value::integer(v) : fallback;
      }
      double v = 0;
      return js_parse_float(operand.as_string(), v) ? jinja_value::floating(v) : fallback;
    }
    if (operand.is_number()) return operand;
    if (operand.kind() == jinja_kind::boolean) {
      return name == "int" ? jinja_value::integer(operand.as_bool() ? 1 : 0)
                           : jinja_value::floating(operand.as_bool() ? 1.0 : 0.0);
    }
    throw jinja_runtime_error("Cannot apply filter \"" + name + "\" to type: " + operand.type_name());
  }
  if (name == "default") {
    const jinja_call_args args = evaluate_arguments(call.children, 1, scope);
    const jinja_value fallback = args.positional.empty() ? jinja_value::string("") : args.positional[0];
    const jinja_value flag = positional_or(args, 1, "boolean", jinja_value::boolean(false));
    if (flag.kind() != jinja_kind::boolean) throw jinja_runtime_error("`default` filter flag must be a boolean");
    if (operand.is_undefined() || (flag.as_bool() && !operand.truthy())) return fallback;
    return operand;
  }

  if (operand.is_array()) {
    const auto& items = operand.items();
    if (name == "sort") {
      const jinja_call_args args = evaluate_arguments(call.children, 1, scope);
      const jinja_value reverse = positional_or(args, 0, "reverse", jinja_value::boolean(false));
      if (reverse.kind() != jinja_kind::boolean) throw jinja_runtime_error("reverse must be a boolean");
      const jinja_value case_sensitive = positional_or(args, 1, "case_sensitive", jinja_value::boolean(false));
      if (case_sensitive.kind() != jinja_kind::boolean) throw jinja_runtime_error("case_sensitive must be a boolean");
      const jinja_value attribute = positional_or(args, 2, "attribute", jinja_value::none());
      if (!(attribute.is_string() || attribute.kind() == jinja_kind::integer || attribute.is_none())) {
        throw jinja_runtime_error("attribute must be a string, integer, or null");
      }
      auto key = [&](const jinja_value& item) {
        if (attribute.is_none()) return item;
        return attribute_path(item, attribute.is_string() ? attribute.as_string() : std::to_string(attribute.as_int()));
      };
      jinja_array sorted = items;
      std::stable_sort(sorted.begin(), sorted.end(), [&](const jinja_value& a, const jinja_value& b) {
        const int r = compare_values(key(a), key(b), case_sensitive.as_bool());
        return reverse.as_bool() ? r > 0 : r < 0;
      });
      return jinja_value::array(std::move(sorted));
    }
    if (name == "selectattr" || name == "rejectattr") {
      const bool select = name == "selectattr";
      for (const auto& item : items) {
        if (!item.is_attribute_container())
          throw jinja_runtime_error("`" + name + "` can only be applied to array of objects");
      }
      for (std::size_t i = 1; i < call.children.size(); ++i) {
        if (call.children[i]->kind != nk::string_literal)
          throw jinja_runtime_error("arguments of `" + name + "` must be strings");
      }
      const std::string attr = call.children.size() > 1 ? call.children[1]->text : std::string();
      const bool has_test_name = call.children.size() > 2;
      const std::string test_name = has_test_name ? call.children[2]->text : std::string();
      const jinja_value argument =
          call.children.size() > 3 ? jinja_value::string(call.children[3]->text) : jinja_value();
      if (has_test_name && !has_test(test_name)) throw jinja_runtime_error("Unknown test: " + test_name);
      jinja_array out;
      for (const auto& item : items) {
        // A missing attribute fails the test whatever the test is (even "undefined"), as in the reference.
        const jinja_value* a = item.fields().find(attr);
        const bool result = a != nullptr && (has_test_name ? run_test(test_name, *a, argument) : a->truthy());
        if (result == select) out.push_back(item);
      }
      return jinja_value::array(std::move(out));
    }
    if (name == "map") {
      const jinja_call_args args = evaluate_arguments(call.children, 1, scope);
      const jinja_value* attr = args.kwarg("attribute");
      if (!attr) throw jinja_runtime_error("`map` expressions without `attribute` set are not currently supported.");
      if (!attr->is_string()) throw jinja_runtime_error("attribute must be a string");
      const jinja_value* fallback = args.kwarg("default");
      jinja_array out;
      for (const auto& item : items) {
        if (!item.is_attribute_container()) throw jinja_runtime_error("items in map must be an object");
        jinja_value v = attribute_path(item, attr->as_string());
        out.push_back(v.is_undefined() && fallback ? *fallback : v);
      }
      return jinja_value::array(std::move(out));
    }
    throw jinja_runtime_error("Unknown ArrayValue filter: " + name);
  }
  if (operand.is_string()) {
    if (name == "indent") {
      const jinja_call_args args = evaluate_arguments(call.children, 1, scope);
      const jinja_value width = positional_or(args, 0, "width", jinja_value::integer(4));
      if (width.kind() != jinja_kind::integer) throw jinja_runtime_error("width must be a number");
      const jinja_value first = positional_or(args, 1, "first", jinja_value::boolean(false));
      const jinja_value blank = positional_or(args, 2, "blank", jinja_value::boolean(false));
      return jinja_value::string(indent_lines(
          operand.as_string(), std::string(static_cast<std::size_t>(std::max<std::int64_t>(width.as_int(), 0)), ' '),
          first.truthy(), blank.truthy()));
    }
    if (name == "replace")
      return member_builtin(operand, "replace").callable()(evaluate_arguments(call.children, 1, scope));
    throw jinja_runtime_error("Unknown StringValue filter: " + name);
  }
  if (operand.is_object()) {
    const jinja_value builtin = member_builtin(operand, name);
    if (builtin.kind() == jinja_kind::function) return builtin.callable()(evaluate_arguments(call.children, 1, scope));
    throw jinja_runtime_error("Unknown ObjectValue filter: " + name);
  }
  throw jinja_runtime_error("Cannot apply filter \"" + name + "\" to type: " + operand.type_name());
}

}  // namespace troupe
