#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe {

class jinja_value;

using jinja_array = std::vector<jinja_value>;

// A dict that keeps insertion order, as Python dicts and JavaScript Maps do; templates iterate
// tools and arguments in the order the client sent them.
struct jinja_object {
  std::vector<std::pair<std::string, jinja_value>> entries;

  const jinja_value* find(const std::string& key) const;
  jinja_value* find(const std::string& key);
  void set(const std::string& key, jinja_value value);  // replaces in place, else appends
};

// Arguments of a call: positional first, then keyword arguments in source order.
struct jinja_call_args {
  std::vector<jinja_value> positional;
  std::vector<std::pair<std::string, jinja_value>> keyword;

  const jinja_value* kwarg(const std::string& name) const;
};

using jinja_function = std::function<jinja_value(const jinja_call_args&)>;

enum class jinja_kind {
  undefined,  // a name or attribute that does not exist
  none,
  boolean,
  integer,
  floating,
  string,
  array,
  tuple,  // an array written (a, b); differs from array only in its type name
  object,
  ns,  // namespace(): the one mutable-by-attribute object
  function,
};

// A dynamic template value. Scalars are held by value; arrays, objects, namespaces and functions
// are shared, so `x == y` on containers compares identity, exactly as the reference does.
class jinja_value {
 public:
  jinja_value() = default;  // undefined

  static jinja_value none();
  static jinja_value boolean(bool v);
  static jinja_value integer(std::int64_t v);
  static jinja_value floating(double v);
  static jinja_value string(std::string v);
  static jinja_value array(jinja_array items);
  static jinja_value tuple(jinja_array items);
  static jinja_value object(jinja_object fields);
  static jinja_value ns(jinja_object fields);
  static jinja_value function(jinja_function fn);

  // JSON -> value. Objects keep the iteration order of the JSON type (sorted keys for
  // nlohmann::json, insertion order for nlohmann::ordered_json). Whole-valued floats become
  // integers, as JSON.parse does.
  static jinja_value from_json(const nlohmann::json& j);
  static jinja_value from_json(const nlohmann::ordered_json& j);

  jinja_kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == jinja_kind::undefined; }
  bool is_none() const { return kind_ == jinja_kind::none; }
  bool is_string() const { return kind_ == jinja_kind::string; }
  bool is_number() const { return kind_ == jinja_kind::integer || kind_ == jinja_kind::floating; }
  bool is_array() const { return kind_ == jinja_kind::array || kind_ == jinja_kind::tuple; }
  bool is_object() const { return kind_ == jinja_kind::object; }
  bool is_attribute_container() const { return kind_ == jinja_kind::object || kind_ == jinja_kind::ns; }

  bool as_bool() const { return std::get<bool>(data_); }
  std::int64_t as_int() const { return std::get<std::int64_t>(data_); }
  double as_number() const;  // integer, floating or boolean as a double
  const std::string& as_string() const { return std::get<std::string>(data_); }
  jinja_array& items() const { return *std::get<std::shared_ptr<jinja_array>>(data_); }
  jinja_object& fields() const { return *std::get<std::shared_ptr<jinja_object>>(data_); }
  const jinja_function& callable() const { return *std::get<std::shared_ptr<jinja_function>>(data_); }

  // Python truthiness: empty strings, arrays and objects are false; namespaces and functions true.
  bool truthy() const;

  // The reference's runtime type name ("StringValue", "UndefinedValue", ...), used in messages.
  std::string type_name() const;

  // What {{ value }} prints: floats keep a ".0", containers print as JSON, booleans as true/false.
  std::string to_output() const;

  // What `+` and `~` concatenate and `join` joins (JavaScript's String(value)): whole floats
  // lose their ".0", arrays join their elements with ",".
  std::string to_concat() const;

  // JavaScript `===`: primitives by value, containers by identity.
  bool strict_equals(const jinja_value& other) const;
  // JavaScript `==` (what the reference uses for == and !=): also none == undefined,
  // and numbers, booleans and numeric strings compare as numbers.
  bool loose_equals(const jinja_value& other) const;

 private:
  using data_type = std::variant<std::monostate, bool, std::int64_t, double, std::string, std::shared_ptr<jinja_array>,
                                 std::shared_ptr<jinja_object>, std::shared_ptr<jinja_function>>;

  // For the named constructors above, which pair each kind with its one representation.
  jinja_value(jinja_kind kind, data_type data) : kind_(kind), data_(std::move(data)) {}

  jinja_kind kind_ = jinja_kind::undefined;
  data_type data_;
};

struct jinja_json_options {
  std::optional<int> indent;  // pretty-print with this many spaces per level
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::optional<std::pair<std::string, std::string>> separators;  // (item, key)
  bool undefined_as_null = true;  // tojson writes null; printing a container writes undefined
};

// The `tojson` filter: Python json.dumps layout (", " and ": " separators; "," with indent).
std::string to_json(const jinja_value& value, const jinja_json_options& options, int depth = 0);

}  // namespace troupe
