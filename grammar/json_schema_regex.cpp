#include "grammar/json_schema_regex.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "grammar/grammar_error.hpp"
#include "grammar/regex.hpp"

namespace troupe {

namespace {

using json = nlohmann::ordered_json;

// One character of a JSON string: anything but '"', '\' and controls, or a short escape.
const std::string string_char = R"((?:[^"\\\x{0}-\x{1F}]|\\["\\/bfnrt]))";
const std::string json_string = "\"" + string_char + "*\"";
// At most 15 digits before the point and 15 after, exponents of 2 digits: every number the
// grammar lets out is a finite double (and an integer a 64-bit one) in every JSON parser; an
// unbounded run of digits from random weights would overflow them (1e400 is Infinity).
const std::string json_integer = "-?(?:0|[1-9][0-9]{0,14})";
const std::string json_number = R"(-?(?:0|[1-9][0-9]{0,14})(?:\.[0-9]{1,15})?(?:[eE][+-]?[0-9]{1,2})?)";
// A fraction whose last digit is not 0: the value lies strictly between two integers.
const std::string fraction = R"(\.[0-9]{0,5}[1-9])";
// Bounds beyond this are treated as absent (doubles lose integer precision past 2^53).
constexpr double max_bound = 1e15;

std::string alternation(const std::vector<std::string>& options) {
  if (options.size() == 1) return options[0];
  std::string out = "(?:";
  for (size_t i = 0; i < options.size(); ++i) {
    if (i > 0) out += '|';
    out += options[i];
  }
  return out + ")";
}

std::string repeat(const std::string& regex, int min, int max) {
  return "(?:" + regex + "){" + std::to_string(min) + "," + (max < 0 ? "" : std::to_string(max)) + "}";
}

// Integers from `lo` to `hi`, both written with the same number of digits.
std::string same_length_range(const std::string& lo, const std::string& hi) {
  if (lo.size() == 1) return lo == hi ? lo : "[" + lo + "-" + hi + "]";
  if (lo[0] == hi[0]) return lo.substr(0, 1) + same_length_range(lo.substr(1), hi.substr(1));
  const size_t rest = lo.size() - 1;
  std::vector<std::string> parts;
  parts.push_back(lo.substr(0, 1) + same_length_range(lo.substr(1), std::string(rest, '9')));
  if (hi[0] - lo[0] > 1) {
    const char a = static_cast<char>(lo[0] + 1), b = static_cast<char>(hi[0] - 1);
    parts.push_back((a == b ? std::string(1, a) : "[" + std::string(1, a) + "-" + std::string(1, b) + "]") + "[0-9]{" +
                    std::to_string(rest) + "}");
  }
  parts.push_back(hi.substr(0, 1) + same_length_range(std::string(rest, '0'), hi.substr(1)));
  return alternation(parts);
}

// Non-negative integers in [a, b] (b absent: unbounded), without leading zeros.
std::string non_negative_range(uint64_t a, std::optional<uint64_t> b) {
  std::vector<std::string> parts;
  const size_t a_digits = std::to_string(a).size();
  const size_t b_digits = b ? std::to_string(*b).size() : a_digits;
  uint64_t power = 1;  // 10^(digits - 1)
  for (size_t d = 1; d < a_digits; ++d) power *= 10;
  for (size_t digits = a_digits; digits <= b_digits; ++digits, power *= 10) {
    const uint64_t lo = std::max(a, digits == 1 ? 0 : power);
    const uint64_t hi = b ? std::min(*b, power * 10 - 1) : power * 10 - 1;
    if (lo <= hi) parts.push_back(same_length_range(std::to_string(lo), std::to_string(hi)));
  }
  // No upper bound: up to 15 digits in all, as json_integer.
  if (!b)
    parts.push_back("[1-9][0-9]{" + std::to_string(a_digits) + "," + std::to_string(std::max<size_t>(a_digits, 14)) +
                    "}");
  if (parts.empty()) return {};
  return alternation(parts);
}

std::string date_regex() { return R"([0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8]))"; }
std::string time_regex() { return R"((?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]Z)"; }

std::string format_regex(const std::string& format, const std::string& path) {
  if (format == "date") return date_regex();
  if (format == "time") return time_regex();
  if (format == "date-time") return date_regex() + "T" + time_regex();
  if (format == "uuid") return "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
  if (format == "email") return R"([a-z0-9]{1,20}(?:\.[a-z0-9]{1,20})?@[a-z0-9]{1,20}\.[a-z]{2,6})";
  if (format == "ipv4") {
    const std::string octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    return "(?:" + octet + R"(\.){3})" + octet;
  }
  throw grammar_error(path + ": the string format \"" + format +
                      "\" is not supported (supported: date, time, date-time, uuid, email, ipv4)");
}

const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> keys = {"title",
                                             "description",
                                             "examples",
                                             "default",
                                             "$schema",
                                             "$id",
                                             "$comment",
                                             "deprecated",
                                             "readOnly",
                                             "writeOnly",
                                             "$defs",
                                             "definitions",
                                             "additionalProperties"};
  return keys;
}

const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> keys = {"type",
                                             "properties",
                                             "required",
                                             "items",
                                             "minItems",
                                             "maxItems",
                                             "enum",
                                             "const",
                                             "minLength",
                                             "maxLength",
                                             "pattern",
                                             "format",
                                             "minimum",
                                             "maximum",
                                             "exclusiveMinimum",
                                             "exclusiveMaximum",
                                             "anyOf",
                                             "oneOf",
                                             "allOf",
                                             "$ref",
                                             "uniqueItems"};
  return keys;
}

class schema_converter {
 public:
  explicit schema_converter(const json& root) : root_(root) {}

  std::string convert(const json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) throw grammar_error(path + ": the schema false matches nothing");
      return json_value_regex();
    }
    if (!s.is_object()) throw grammar_error(path + ": a schema must be an object or a boolean, got " + s.dump());
    for (const auto& [key, value] : s.items()) {
      if (!supported_keywords().count(key) && !annotation_keywords().count(key)) {
        throw grammar_error(path + ": the keyword \"" + key + "\" is not supported");
      }
    }
    if (s.contains("uniqueItems") && s["uniqueItems"] != false) {
      throw grammar_error(path + ": uniqueItems is not supported");
    }
    if (s.contains("$ref")) return convert_ref(s, path);
    if (s.contains("enum")) return convert_enum(s["enum"], path + ".enum");
    if (s.contains("const")) return literal(s["const"]);
    for (const char* combinator : {"anyOf", "oneOf"}) {
      if (!s.contains(combinator)) continue;
      const json& options = s[combinator];
      if (!options.is_array() || options.empty()) {
        throw grammar_error(path + "." + combinator + ": expected a non-empty array of schemas");
      }
      std::vector<std::string> parts;
      for (size_t i = 0; i < options.size(); ++i) {
        parts.push_back(convert(options[i], path + "." + combinator + "[" + std::to_string(i) + "]"));
      }
      return alternation(parts);
    }
    if (s.contains("allOf")) {
      const json& all = s["allOf"];
      if (!all.is_array() || all.size() != 1) {
        throw grammar_error(path + ".allOf: only an allOf of exactly one schema is supported");
      }
      return convert(all[0], path + ".allOf[0]");
    }
    if (!s.contains("type")) {
      if (s.contains("properties") || s.contains("required")) return convert_object(s, path);
      if (s.contains("items")) return convert_array(s, path);
      return json_value_regex();
    }
    const json& type = s["type"];
    if (type.is_string()) return convert_type(type.get<std::string>(), s, path);
    if (!type.is_array() || type.empty()) {
      throw grammar_error(path + ".type: expected a type name or a non-empty array of them");
    }
    std::vector<std::string> parts;
    for (const json& t : type) {
      if (!t.is_string()) throw grammar_error(path + ".type: expected type names, got " + t.dump());
      parts.push_back(convert_type(t.get<std::string>(), s, path));
    }
    return alternation(parts);
  }

 private:
  static std::string literal(const json& value) { return regex_escape(value.dump()); }

  std::string convert_enum(const json& values, const std::string& path) {
    if (!values.is_array() || values.empty()) throw grammar_error(path + ": expected a non-empty array");
    std::vector<std::string> parts;
    for (const json& v : values) parts.push_back(literal(v));
    return alternation(parts);
  }

  std::string convert_ref(const json& s, const std::string& path) {
    for (const auto& [key, value] : s.items()) {
      if (key != "$ref" && !annotation_keywords().count(key)) {
        throw grammar_error(path + ": keywords beside $ref (\"" + key + "\") are not supported");
      }
    }
    const json& ref = s["$ref"];
    if (!ref.is_string()) throw grammar_error(path + ".$ref: expected a string");
    const std::string target = ref.get<std::string>();
    std::string section, name;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (target.rfind(p, 0) == 0) {
        section = p.substr(2, p.size() - 3);
        name = target.substr(p.size());
      }
    }
    if (section.empty() || name.empty() || name.find('/') != std::string::npos) {
      throw grammar_error(path + ".$ref: \"" + target +
                          "\" is not supported (only #/$defs/NAME and #/definitions/NAME)");
    }
    if (!root_.is_object() || !root_.contains(section) || !root_[section].contains(name)) {
      throw grammar_error(path + ".$ref: \"" + target + "\" names no definition");
    }
    if (std::find(ref_stack_.begin(), ref_stack_.end(), target) != ref_stack_.end()) {
      throw grammar_error(path + ".$ref: \"" + target + "\" is recursive; recursive schemas are not supported");
    }
    ref_stack_.push_back(target);
    std::string out = convert(root_[section][name], target);
    ref_stack_.pop_back();
    return out;
  }

  std::string convert_type(const std::string& type, const json& s, const std::string& path) {
    if (type == "string") return convert_string(s, path);
    if (type == "integer") return convert_integer(s, path);
    if (type == "number") return convert_number(s, path);
    if (type == "boolean") return "(?:true|false)";
    if (type == "null") return "null";
    if (type == "object") return convert_object(s, path);
    if (type == "array") return convert_array(s, path);
    throw grammar_error(path + ".type: unknown type \"" + type + "\"");
  }

  static int count(const json& s, const char* key, const std::string& path, int fallback) {
    if (!s.contains(key)) return fallback;
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 10000) {
      throw grammar_error(path + "." + key + ": expected an integer in [0, 10000], got " + v.dump());
    }
    return static_cast<int>(v.get<int64_t>());
  }

  std::string convert_string(const json& s, const std::string& path) {
    const int min = count(s, "minLength", path, 0);
    const int max = count(s, "maxLength", path, -1);
    if (max >= 0 && max < min) {
      throw grammar_error(path + ": maxLength " + std::to_string(max) + " is below minLength " + std::to_string(min));
    }
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("format")) {
      if (!s["format"].is_string()) throw grammar_error(path + ".format: expected a string");
      if (lengths || s.contains("pattern")) {
        throw grammar_error(path + ": format together with pattern, minLength or maxLength is not supported");
      }
      return "\"" + format_regex(s["format"].get<std::string>(), path + ".format") + "\"";
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) throw grammar_error(path + ".pattern: expected a string");
      if (lengths) throw grammar_error(path + ": pattern together with minLength/maxLength is not supported");
      return "\"" + convert_pattern(s["pattern"].get<std::string>(), path + ".pattern") + "\"";
    }
    return "\"" + repeat(string_char, min, max) + "\"";
  }

  // The pattern's characters are written raw into the JSON string: classes lose '"', '\' and
  // controls. JSON schema patterns are not anchored; a missing anchor lets any characters in.
  static std::string convert_pattern(const std::string& pattern, const std::string& path) {
    regex_tree tree;
    try {
      tree = parse_regex(pattern);
    } catch (const grammar_error& e) {
      throw grammar_error(path + ": " + e.what());
    }
    const std::vector<codepoint_range> safe = complement_ranges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
    for (regex_node& node : tree.nodes) {
      if (node.kind == regex_node::type::char_class) node.ranges = intersect_ranges(node.ranges, safe);
    }
    const bool anchored_start = !pattern.empty() && pattern.front() == '^';
    const bool anchored_end = pattern.size() >= 2 && pattern.back() == '$' && pattern[pattern.size() - 2] != '\\';
    const std::string any = R"([^"\\\x{0}-\x{1F}]*)";
    return (anchored_start ? "" : any) + print_regex(tree) + (anchored_end ? "" : any);
  }

  // A bound of `key`, or nothing; draft-4 style boolean exclusive flags are read too.
  static std::optional<double> bound(const json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    const json& v = s[key];
    if (!v.is_number()) throw grammar_error(path + "." + key + ": expected a number, got " + v.dump());
    const double value = v.get<double>();
    if (std::fabs(value) > max_bound) return std::nullopt;
    return value;
  }

  struct bounds {
    std::optional<double> lo, hi;
    bool lo_exclusive = false, hi_exclusive = false;
  };

  static bounds read_bounds(const json& s, const std::string& path) {
    bounds b;
    b.lo = bound(s, "minimum", path);
    b.hi = bound(s, "maximum", path);
    if (auto x = bound(s, "exclusiveMinimum", path); x && (!b.lo || *x >= *b.lo)) {
      b.lo = x;
      b.lo_exclusive = true;
    }
    if (auto x = bound(s, "exclusiveMaximum", path); x && (!b.hi || *x <= *b.hi)) {
      b.hi = x;
      b.hi_exclusive = true;
    }
    return b;
  }

  // The integers within `b`, as bounds for integer_range_regex.
  static std::pair<std::optional<int64_t>, std::optional<int64_t>> integer_bounds(const bounds& b) {
    std::optional<int64_t> lo, hi;
    if (b.lo) {
      const double c = std::ceil(*b.lo);
      lo = static_cast<int64_t>(b.lo_exclusive && c == *b.lo ? c + 1 : c);
    }
    if (b.hi) {
      const double f = std::floor(*b.hi);
      hi = static_cast<int64_t>(b.hi_exclusive && f == *b.hi ? f - 1 : f);
    }
    return {lo, hi};
  }

  static std::string empty_range(const std::string& path) {
    throw grammar_error(path + ": minimum/maximum leave no value in between");
  }

  std::string convert_integer(const json& s, const std::string& path) {
    const bounds b = read_bounds(s, path);
    if (!b.lo && !b.hi) return json_integer;
    auto [lo, hi] = integer_bounds(b);
    if (lo && hi && *lo > *hi) return empty_range(path);
    return integer_range_regex(lo, hi);
  }

  std::string convert_number(const json& s, const std::string& path) {
    const bounds b = read_bounds(s, path);
    if (!b.lo && !b.hi) return json_number;
    std::vector<std::string> parts;
    auto [lo, hi] = integer_bounds(b);
    if (!(lo && hi && *lo > *hi)) parts.push_back(integer_range_regex(lo, hi));
    // "i.f" lies in (i, i + 1): i >= lo and i + 1 <= hi keep it inside either kind of bound.
    {
      const int64_t from = std::max<int64_t>(0, b.lo ? static_cast<int64_t>(std::ceil(*b.lo)) : 0);
      std::optional<int64_t> to;
      if (b.hi) to = static_cast<int64_t>(std::floor(*b.hi)) - 1;
      if (!to || *to >= from) parts.push_back("(?:" + integer_range_regex(from, to) + ")" + fraction);
    }
    // "-i.f" lies in (-i - 1, -i): -i - 1 >= lo and -i <= hi.
    if (!b.lo || *b.lo < 0) {
      const int64_t from = std::max<int64_t>(0, b.hi ? static_cast<int64_t>(std::ceil(-*b.hi)) : 0);
      std::optional<int64_t> to;
      if (b.lo) to = static_cast<int64_t>(std::floor(-*b.lo)) - 1;
      if (!to || *to >= from) parts.push_back("-(?:" + integer_range_regex(from, to) + ")" + fraction);
    }
    if (parts.empty()) return empty_range(path);
    return alternation(parts);
  }

  std::string convert_object(const json& s, const std::string& path) {
    if (!s.contains("properties")) {
      if (s.contains("required") && !s["required"].empty()) {
        throw grammar_error(path + ": required properties without \"properties\" are not supported");
      }
      return json_object_regex();
    }
    const json& properties = s["properties"];
    if (!properties.is_object()) throw grammar_error(path + ".properties: expected an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) throw grammar_error(path + ".required: expected an array of names");
      for (const json& name : s["required"]) {
        if (!name.is_string()) throw grammar_error(path + ".required: expected names, got " + name.dump());
        if (!properties.contains(name.get<std::string>())) {
          throw grammar_error(path + ".required: \"" + name.get<std::string>() + "\" is not in properties");
        }
        required.insert(name.get<std::string>());
      }
    }
    std::vector<std::string> members;
    std::vector<bool> is_required;
    for (const auto& [name, schema] : properties.items()) {
      members.push_back(regex_escape(json(name).dump()) + ":" + convert(schema, path + ".properties." + name));
      is_required.push_back(required.count(name) > 0);
    }
    if (members.empty()) return R"(\{\})";
    const auto first_required = std::find(is_required.begin(), is_required.end(), true);
    std::string out = R"(\{)";
    if (first_required != is_required.end()) {
      const size_t r = static_cast<size_t>(first_required - is_required.begin());
      for (size_t i = 0; i < r; ++i) out += "(?:" + members[i] + ",)?";
      out += members[r];
      for (size_t i = r + 1; i < members.size(); ++i) {
        out += is_required[i] ? "," + members[i] : "(?:," + members[i] + ")?";
      }
    } else {
      // All optional: which one comes first decides where the commas go.
      std::vector<std::string> firsts;
      for (size_t j = 0; j < members.size(); ++j) {
        std::string option = members[j];
        for (size_t i = j + 1; i < members.size(); ++i) option += "(?:," + members[i] + ")?";
        firsts.push_back(option);
      }
      out += "(?:" + alternation(firsts) + ")?";
    }
    return out + R"(\})";
  }

  std::string convert_array(const json& s, const std::string& path) {
    const int min = count(s, "minItems", path, 0);
    const int max = count(s, "maxItems", path, -1);
    if (max >= 0 && max < min) {
      throw grammar_error(path + ": maxItems " + std::to_string(max) + " is below minItems " + std::to_string(min));
    }
    const std::string item =
        s.contains("items") ? convert(s["items"], path + ".items") : json_value_regex(default_json_depth - 1);
    if (max == 0) return R"(\[\])";
    if (min == 0) return R"(\[(?:)" + item + repeat("," + item, 0, max < 0 ? -1 : max - 1) + R"()?\])";
    return R"(\[)" + item + repeat("," + item, min - 1, max < 0 ? -1 : max - 1) + R"(\])";
  }

  const json& root_;
  std::vector<std::string> ref_stack_;
};

}  // namespace

std::string json_value_regex(int depth) {
  std::string value = alternation({json_string, json_number, "true", "false", "null"});
  for (int d = 0; d < depth; ++d) {
    const std::string member = json_string + ":" + value;
    const std::string object = R"(\{(?:)" + member + "(?:," + member + R"()*)?\})";
    const std::string array = R"(\[(?:)" + value + "(?:," + value + R"()*)?\])";
    value = alternation({json_string, json_number, "true", "false", "null", object, array});
  }
  return value;
}

std::string json_object_regex(int depth) {
  const std::string value = json_value_regex(std::max(depth - 1, 0));
  const std::string member = json_string + ":" + value;
  return R"(\{(?:)" + member + "(?:," + member + R"()*)?\})";
}

std::string integer_range_regex(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<std::string> parts;
  if (!lo || *lo < 0) {
    // Magnitudes of the negative integers in range.
    const uint64_t from = hi && *hi < 0 ? static_cast<uint64_t>(-*hi) : 1;
    std::optional<uint64_t> to;
    if (lo) to = static_cast<uint64_t>(-*lo);
    if (!to || *to >= from) parts.push_back("-(?:" + non_negative_range(from, to) + ")");
  }
  if (!hi || *hi >= 0) {
    const uint64_t from = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    std::optional<uint64_t> to;
    if (hi) to = static_cast<uint64_t>(*hi);
    if (!to || *to >= from) parts.push_back(non_negative_range(from, to));
  }
  if (parts.empty()) throw grammar_error("the integer range is empty");
  return alternation(parts);
}

std::string json_schema_to_regex(const nlohmann::ordered_json& schema) {
  schema_converter converter(schema);
  return converter.convert(schema, "$");
}

}  // namespace troupe
