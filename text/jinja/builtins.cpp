#include "text/jinja/builtins.hpp"

#include <algorithm>
#include <ctime>
#include <limits>

#include "text/jinja/error.hpp"
#include "text/jinja/interpreter.hpp"
#include "text/jinja/strings.hpp"
#include "text/unicode/utf8.hpp"

namespace troupe {

namespace {

namespace js = jinja_strings;

using method = std::function<jinja_value(const jinja_call_args&)>;

jinja_value arg(const jinja_call_args& args, std::size_t i) {
  return i < args.positional.size() ? args.positional[i] : jinja_value();
}

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// str.startswith / str.endswith with a string or a tuple of strings.
jinja_value affix_test(const std::string& self, const jinja_call_args& args, const char* name, bool prefix) {
  if (args.positional.empty()) throw jinja_runtime_error(std::string(name) + "() requires at least one argument");
  auto matches = [&](const std::string& p) {
    if (p.size() > self.size()) return false;
    return prefix ? self.compare(0, p.size(), p) == 0 : self.compare(self.size() - p.size(), p.size(), p) == 0;
  };
  const jinja_value& pattern = args.positional[0];
  if (pattern.is_string()) return jinja_value::boolean(matches(pattern.as_string()));
  if (pattern.is_array()) {
    for (const auto& item : pattern.items()) {
      if (!item.is_string()) throw jinja_runtime_error(std::string(name) + "() tuple elements must be strings");
      if (matches(item.as_string())) return jinja_value::boolean(true);
    }
    return jinja_value::boolean(false);
  }
  throw jinja_runtime_error(std::string(name) + "() argument must be a string or tuple of strings");
}

// str.split(sep=None, maxsplit=-1), Python's behaviour.
jinja_value split(const std::string& self, const jinja_call_args& args) {
  const jinja_value sep = args.positional.size() > 0 ? args.positional[0] : jinja_value::none();
  if (!(sep.is_string() || sep.is_none())) throw jinja_runtime_error("sep argument must be a string or null");
  const jinja_value maxsplit_value = args.positional.size() > 1 ? args.positional[1] : jinja_value::integer(-1);
  if (maxsplit_value.kind() != jinja_kind::integer) throw jinja_runtime_error("maxsplit argument must be a number");
  const std::int64_t maxsplit = maxsplit_value.as_int();
  jinja_array parts;
  if (sep.is_none()) {
    const auto cps = js::decode_utf8(js::trim_start(self));
    std::size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && utf8::is_js_whitespace(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit != -1 && static_cast<std::int64_t>(parts.size()) >= maxsplit) {
        parts.push_back(jinja_value::string(js::encode_utf8(cps, i, cps.size())));
        break;
      }
      std::size_t j = i;
      while (j < cps.size() && !utf8::is_js_whitespace(cps[j])) ++j;
      parts.push_back(jinja_value::string(js::encode_utf8(cps, i, j)));
      i = j;
    }
    return jinja_value::array(std::move(parts));
  }
  const std::string& s = sep.as_string();
  if (s.empty()) throw jinja_runtime_error("empty separator");
  std::vector<std::string> pieces;
  std::size_t start = 0;
  while (true) {
    const std::size_t found = self.find(s, start);
    if (found == std::string::npos) {
      pieces.push_back(self.substr(start));
      break;
    }
    pieces.push_back(self.substr(start, found - start));
    start = found + s.size();
  }
  if (maxsplit != -1 && static_cast<std::int64_t>(pieces.size()) > maxsplit) {
    std::string rest;
    for (std::size_t i = static_cast<std::size_t>(maxsplit); i < pieces.size(); ++i) {
      if (i > static_cast<std::size_t>(maxsplit)) rest += s;
      rest += pieces[i];
    }
    pieces.resize(static_cast<std::size_t>(maxsplit));
    pieces.push_back(rest);
  }
  for (auto& p : pieces) parts.push_back(jinja_value::string(std::move(p)));
  return jinja_value::array(std::move(parts));
}

jinja_value replace(const std::string& self, const jinja_call_args& args) {
  if (args.positional.size() < 2) throw jinja_runtime_error("replace() requires at least two arguments");
  const jinja_value& old_value = args.positional[0];
  const jinja_value& new_value = args.positional[1];
  if (!old_value.is_string() || !new_value.is_string())
    throw jinja_runtime_error("replace() arguments must be strings");
  jinja_value count = jinja_value::none();
  if (args.positional.size() > 2) {
    count = args.positional[2];
  } else if (const jinja_value* c = args.kwarg("count")) {
    count = *c;
  }
  if (!(count.kind() == jinja_kind::integer || count.is_none())) {
    throw jinja_runtime_error("replace() count argument must be a number or null");
  }
  std::int64_t remaining =
      count.is_none() || count.as_int() < 0 ? std::numeric_limits<std::int64_t>::max() : count.as_int();
  const std::string& from = old_value.as_string();
  const std::string& to = new_value.as_string();
  if (remaining == 0) return jinja_value::string(self);
  std::string out;
  if (from.empty()) {
    // An empty pattern matches between every character, as in Python.
    const auto cps = js::decode_utf8(self);
    for (std::size_t i = 0; i <= cps.size(); ++i) {
      if (remaining > 0) {
        out += to;
        --remaining;
      }
      if (i < cps.size()) utf8::append(out, cps[i]);
    }
    return jinja_value::string(std::move(out));
  }
  std::size_t start = 0;
  while (remaining > 0) {
    const std::size_t found = self.find(from, start);
    if (found == std::string::npos) break;
    out.append(self, start, found - start);
    out += to;
    start = found + from.size();
    --remaining;
  }
  out.append(self, start, std::string::npos);
  return jinja_value::string(std::move(out));
}

jinja_value string_method(const std::string& self, const std::string& name) {
  auto fn = [](method m) { return jinja_value::function(std::move(m)); };
  if (name == "length") return jinja_value::integer(static_cast<std::int64_t>(js::utf16_length(self)));
  if (name == "upper") return fn([self](const jinja_call_args&) { return jinja_value::string(js::to_upper(self)); });
  if (name == "lower") return fn([self](const jinja_call_args&) { return jinja_value::string(js::to_lower(self)); });
  // The reference ignores strip's argument and removes all whitespace; so does Troupe.
  if (name == "strip") return fn([self](const jinja_call_args&) { return jinja_value::string(js::trim(self)); });
  if (name == "lstrip") return fn([self](const jinja_call_args&) { return jinja_value::string(js::trim_start(self)); });
  if (name == "rstrip") return fn([self](const jinja_call_args&) { return jinja_value::string(js::trim_end(self)); });
  if (name == "title") {
    return fn([self](const jinja_call_args&) {
      std::string out = self;
      for (std::size_t i = 0; i < out.size(); ++i) {
        const bool boundary = i == 0 || !is_word_char(out[i - 1]);
        if (boundary && out[i] >= 'a' && out[i] <= 'z') out[i] = static_cast<char>(out[i] - 'a' + 'A');
      }
      return jinja_value::string(std::move(out));
    });
  }
  if (name == "capitalize") {
    return fn([self](const jinja_call_args&) {
      std::string out = self;
      if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 'a' + 'A');
      return jinja_value::string(std::move(out));
    });
  }
  if (name == "startswith")
    return fn([self](const jinja_call_args& a) { return affix_test(self, a, "startswith", true); });
  if (name == "endswith")
    return fn([self](const jinja_call_args& a) { return affix_test(self, a, "endswith", false); });
  if (name == "split") return fn([self](const jinja_call_args& a) { return split(self, a); });
  if (name == "replace") return fn([self](const jinja_call_args& a) { return replace(self, a); });
  return {};
}

jinja_value items_of(const jinja_object& fields) {
  jinja_array out;
  for (const auto& [k, v] : fields.entries) out.push_back(jinja_value::array({jinja_value::string(k), v}));
  return jinja_value::array(std::move(out));
}

jinja_value object_method(const jinja_value& self, const std::string& name) {
  auto fn = [](method m) { return jinja_value::function(std::move(m)); };
  if (name == "get") {
    return fn([self](const jinja_call_args& a) {
      const jinja_value key = arg(a, 0);
      if (!key.is_string()) throw jinja_runtime_error("Object key must be a string: got " + key.type_name());
      if (const jinja_value* found = self.fields().find(key.as_string())) return *found;
      if (a.positional.size() > 1) return a.positional[1];
      return jinja_value::none();
    });
  }
  if (name == "items") return fn([self](const jinja_call_args&) { return items_of(self.fields()); });
  if (name == "keys") {
    return fn([self](const jinja_call_args&) {
      jinja_array out;
      for (const auto& entry : self.fields().entries) out.push_back(jinja_value::string(entry.first));
      return jinja_value::array(std::move(out));
    });
  }
  if (name == "values") {
    return fn([self](const jinja_call_args&) {
      jinja_array out;
      for (const auto& entry : self.fields().entries) out.push_back(entry.second);
      return jinja_value::array(std::move(out));
    });
  }
  if (name == "dictsort") {
    return fn([self](const jinja_call_args& a) {
      jinja_value case_sensitive = a.positional.size() > 0 ? a.positional[0] : jinja_value::boolean(false);
      if (const jinja_value* v = a.kwarg("case_sensitive"); v && a.positional.size() <= 0) case_sensitive = *v;
      if (case_sensitive.kind() != jinja_kind::boolean) throw jinja_runtime_error("case_sensitive must be a boolean");
      jinja_value by = a.positional.size() > 1 ? a.positional[1] : jinja_value::string("key");
      if (const jinja_value* v = a.kwarg("by"); v && a.positional.size() <= 1) by = *v;
      if (!by.is_string()) throw jinja_runtime_error("by must be a string");
      if (by.as_string() != "key" && by.as_string() != "value")
        throw jinja_runtime_error("by must be either 'key' or 'value'");
      jinja_value reverse = a.positional.size() > 2 ? a.positional[2] : jinja_value::boolean(false);
      if (const jinja_value* v = a.kwarg("reverse"); v && a.positional.size() <= 2) reverse = *v;
      if (reverse.kind() != jinja_kind::boolean) throw jinja_runtime_error("reverse must be a boolean");
      jinja_array pairs = items_of(self.fields()).items();
      const std::size_t index = by.as_string() == "key" ? 0 : 1;
      std::stable_sort(pairs.begin(), pairs.end(), [&](const jinja_value& x, const jinja_value& y) {
        const int r = compare_values(x.items()[index], y.items()[index], case_sensitive.as_bool());
        return reverse.as_bool() ? r > 0 : r < 0;
      });
      return jinja_value::array(std::move(pairs));
    });
  }
  return {};
}

const char* const month_long[] = {"January", "February", "March",     "April",   "May",      "June",
                                  "July",    "August",   "September", "October", "November", "December"};
const char* const month_short[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

// The reference's minimal strftime: %Y %m %d %b %B %H %M %%, local time, English month names.
std::string strftime_now(const std::string& format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  auto pad2 = [](int n) { return n < 10 ? "0" + std::to_string(n) : std::to_string(n); };
  std::string out;
  for (std::size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out += format[i];
      continue;
    }
    const char c = format[i + 1];
    switch (c) {
      case 'Y': out += std::to_string(tm.tm_year + 1900); break;
      case 'm': out += pad2(tm.tm_mon + 1); break;
      case 'd': out += pad2(tm.tm_mday); break;
      case 'b': out += month_short[tm.tm_mon]; break;
      case 'B': out += month_long[tm.tm_mon]; break;
      case 'H': out += pad2(tm.tm_hour); break;
      case 'M': out += pad2(tm.tm_min); break;
      case '%': out += '%'; break;
      default:
        out += '%';
        out += c;
        break;
    }
    ++i;
  }
  return out;
}

}  // namespace

jinja_value member_builtin(const jinja_value& object, const std::string& name) {
  switch (object.kind()) {
    case jinja_kind::string: return string_method(object.as_string(), name);
    case jinja_kind::object: return object_method(object, name);
    case jinja_kind::array:
    case jinja_kind::tuple:
      if (name == "length") return jinja_value::integer(static_cast<std::int64_t>(object.items().size()));
      return {};
    default: return {};
  }
}

bool has_test(const std::string& name) {
  static const char* const names[] = {"boolean", "callable", "odd",       "even",     "false",   "true",     "none",
                                      "string",  "number",   "integer",   "iterable", "mapping", "sequence", "lower",
                                      "upper",   "defined",  "undefined", "equalto",  "eq"};
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

bool run_test(const std::string& name, const jinja_value& operand, const jinja_value& argument) {
  const jinja_kind k = operand.kind();
  if (name == "boolean") return k == jinja_kind::boolean;
  if (name == "callable") return k == jinja_kind::function;
  if (name == "odd" || name == "even") {
    if (k != jinja_kind::integer) throw jinja_runtime_error("cannot " + name + " on " + operand.type_name());
    const bool odd = operand.as_int() % 2 != 0;
    return name == "odd" ? odd : !odd;
  }
  if (name == "false") return k == jinja_kind::boolean && !operand.as_bool();
  if (name == "true") return k == jinja_kind::boolean && operand.as_bool();
  if (name == "none") return k == jinja_kind::none;
  if (name == "string") return k == jinja_kind::string;
  if (name == "number") return operand.is_number();
  if (name == "integer") return k == jinja_kind::integer;
  if (name == "iterable") return k == jinja_kind::array || k == jinja_kind::string;
  if (name == "mapping") return k == jinja_kind::object;
  if (name == "sequence") return operand.is_array() || k == jinja_kind::object || k == jinja_kind::string;
  if (name == "lower") return k == jinja_kind::string && operand.as_string() == js::to_lower(operand.as_string());
  if (name == "upper") return k == jinja_kind::string && operand.as_string() == js::to_upper(operand.as_string());
  if (name == "defined") return k != jinja_kind::undefined;
  if (name == "undefined") return k == jinja_kind::undefined;
  if (name == "equalto" || name == "eq") return operand.strict_equals(argument);
  throw jinja_runtime_error("Unknown test: " + name);
}

int compare_values(const jinja_value& a, const jinja_value& b, bool case_sensitive) {
  if (a.is_none() && b.is_none()) return 0;
  if (a.is_none() || b.is_none())
    throw jinja_runtime_error("Cannot compare " + a.type_name() + " with " + b.type_name());
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_undefined() || b.is_undefined()) {
    throw jinja_runtime_error("Cannot compare " + a.type_name() + " with " + b.type_name());
  }
  auto numeric = [](const jinja_value& v) { return v.is_number() || v.kind() == jinja_kind::boolean; };
  if (numeric(a) && numeric(b)) {
    const double x = a.as_number(), y = b.as_number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.type_name() != b.type_name()) {
    throw jinja_runtime_error("Cannot compare different types: " + a.type_name() + " and " + b.type_name());
  }
  if (a.is_string()) {
    const std::string x = case_sensitive ? a.as_string() : js::to_lower(a.as_string());
    const std::string y = case_sensitive ? b.as_string() : js::to_lower(b.as_string());
    return x < y ? -1 : x > y ? 1 : 0;
  }
  throw jinja_runtime_error("Cannot compare type: " + a.type_name());
}

void install_globals(jinja_scope& scope) {
  scope.set("false", jinja_value::boolean(false));
  scope.set("true", jinja_value::boolean(true));
  scope.set("none", jinja_value::none());
  scope.set("False", jinja_value::boolean(false));
  scope.set("True", jinja_value::boolean(true));
  scope.set("None", jinja_value::none());
  scope.set("raise_exception", jinja_value::function([](const jinja_call_args& a) -> jinja_value {
              const jinja_value message = arg(a, 0);
              throw jinja_runtime_error(message.is_undefined() ? "" : message.to_concat());
            }));
  scope.set("range", jinja_value::function([](const jinja_call_args& a) {
              auto number = [](const jinja_value& v) -> std::int64_t {
                if (v.kind() != jinja_kind::integer) throw jinja_runtime_error("range() arguments must be integers");
                return v.as_int();
              };
              std::int64_t start = 0, stop = 0, step = 1;
              if (a.positional.size() == 1) {
                stop = number(a.positional[0]);
              } else if (a.positional.size() >= 2) {
                start = number(a.positional[0]);
                stop = number(a.positional[1]);
                if (a.positional.size() >= 3) step = number(a.positional[2]);
              } else {
                throw jinja_runtime_error("range() requires at least one argument");
              }
              if (step == 0) throw jinja_runtime_error("range() step must not be zero");
              jinja_array out;
              for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
                out.push_back(jinja_value::integer(i));
              return jinja_value::array(std::move(out));
            }));
  scope.set("strftime_now", jinja_value::function([](const jinja_call_args& a) {
              const jinja_value format = arg(a, 0);
              if (!format.is_string()) throw jinja_runtime_error("strftime_now() expects a format string");
              return jinja_value::string(strftime_now(format.as_string()));
            }));
  scope.set("namespace", jinja_value::function([](const jinja_call_args& a) {
              if (a.positional.size() > 1) {
                throw jinja_runtime_error("namespace expected at most 1 argument, got " +
                                          std::to_string(a.positional.size()));
              }
              jinja_object fields;
              if (a.positional.size() == 1) {
                const jinja_value& source = a.positional[0];
                if (source.is_object()) {
                  for (const auto& [k, v] : source.fields().entries) fields.set(k, v);
                } else if (source.is_array()) {
                  for (const auto& pair : source.items()) {
                    if (!pair.is_array() || pair.items().size() != 2) {
                      throw jinja_runtime_error("namespace expected an object or an iterable of [key, value] pairs");
                    }
                    if (!pair.items()[0].is_string()) throw jinja_runtime_error("namespace keys must be strings");
                    fields.set(pair.items()[0].as_string(), pair.items()[1]);
                  }
                } else {
                  throw jinja_runtime_error("'" + source.type_name() + "' object is not iterable");
                }
              }
              for (const auto& [k, v] : a.keyword) fields.set(k, v);
              return jinja_value::ns(std::move(fields));
            }));
}

}  // namespace troupe
