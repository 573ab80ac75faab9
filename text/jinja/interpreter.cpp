#include "text/jinja/interpreter.hpp"

#include <cmath>

#include "text/jinja/builtins.hpp"
#include "text/jinja/error.hpp"
#include "text/jinja/strings.hpp"
#include "text/unicode/utf8.hpp"

namespace troupe {

namespace {

using nk = jinja_node_kind;
namespace js = jinja_strings;

// {% break %} and {% continue %} unwind to the enclosing loop.
struct break_signal {};
struct continue_signal {};

// Python slicing (negative indices count from the end; a negative step walks backwards).
std::vector<std::size_t> slice_indices(std::size_t size, const jinja_value& start_v, const jinja_value& stop_v,
                                       const jinja_value& step_v) {
  const auto n = static_cast<std::int64_t>(size);
  const std::int64_t step = step_v.is_undefined() ? 1 : step_v.as_int();
  std::vector<std::size_t> out;
  if (step == 0) return out;  // the reference loops forever; an empty slice is the sane answer
  std::int64_t start, stop;
  if (step > 0) {
    start = start_v.is_undefined() ? 0 : start_v.as_int();
    start = start < 0 ? std::max<std::int64_t>(n + start, 0) : std::min(start, n);
    stop = stop_v.is_undefined() ? n : stop_v.as_int();
    stop = stop < 0 ? std::max<std::int64_t>(n + stop, 0) : std::min(stop, n);
    for (std::int64_t i = start; i < stop; i += step) out.push_back(static_cast<std::size_t>(i));
  } else {
    start = start_v.is_undefined() ? n - 1 : start_v.as_int();
    start = start < 0 ? std::max<std::int64_t>(n + start, -1) : std::min(start, n - 1);
    stop = stop_v.is_undefined() ? -1 : stop_v.as_int();
    stop = stop < -1 ? std::max<std::int64_t>(n + stop, -1) : std::min(stop, n - 1);
    for (std::int64_t i = start; i > stop; i += step) out.push_back(static_cast<std::size_t>(i));
  }
  return out;
}

bool numeric_like(const jinja_value& v) { return v.is_number() || v.kind() == jinja_kind::boolean; }

}  // namespace

jinja_value jinja_scope::lookup(const std::string& name) const {
  for (const jinja_scope* s = this; s != nullptr; s = s->parent_) {
    auto it = s->variables_.find(name);
    if (it != s->variables_.end()) return it->second;
  }
  return {};
}

std::string jinja_interpreter::render(const jinja_node& program, jinja_scope& globals) {
  try {
    return render_block(program.body, globals);
  } catch (const break_signal&) {
    throw jinja_runtime_error("break outside of a loop");
  } catch (const continue_signal&) {
    throw jinja_runtime_error("continue outside of a loop");
  }
}

std::string jinja_interpreter::render_block(const std::vector<jinja_node_ptr>& statements, jinja_scope& scope) {
  std::string out;
  for (const auto& statement : statements) {
    const jinja_value v = evaluate(*statement, scope);
    if (!v.is_none() && !v.is_undefined()) out += v.to_output();
  }
  return out;
}

jinja_value jinja_interpreter::evaluate(const jinja_node& node, jinja_scope& scope) {
  switch (node.kind) {
    case nk::program: return jinja_value::string(render_block(node.body, scope));
    case nk::comment: return jinja_value::none();
    case nk::text:
    case nk::string_literal: return jinja_value::string(node.text);
    case nk::integer_literal: return jinja_value::integer(node.integer);
    case nk::float_literal: return jinja_value::floating(node.number);
    case nk::identifier: return scope.lookup(node.text);
    case nk::array_literal:
    case nk::tuple_literal: {
      jinja_array items;
      for (const auto& c : node.children) items.push_back(evaluate(*c, scope));
      return node.kind == nk::array_literal ? jinja_value::array(std::move(items))
                                            : jinja_value::tuple(std::move(items));
    }
    case nk::object_literal: {
      jinja_object fields;
      for (std::size_t i = 0; i + 1 < node.children.size(); i += 2) {
        const jinja_value key = evaluate(*node.children[i], scope);
        if (!key.is_string()) throw jinja_runtime_error("Object keys must be strings: got " + key.type_name());
        fields.set(key.as_string(), evaluate(*node.children[i + 1], scope));
      }
      return jinja_value::object(std::move(fields));
    }
    case nk::if_statement: {
      const bool test = evaluate(*node.children[0], scope).truthy();
      return jinja_value::string(render_block(test ? node.body : node.alternate, scope));
    }
    case nk::for_statement: return jinja_value::string(evaluate_for(node, scope));
    case nk::set_statement: return evaluate_set(node, scope);
    case nk::macro: return define_macro(node, scope);
    case nk::break_statement: throw break_signal{};
    case nk::continue_statement: throw continue_signal{};
    case nk::filter_statement: {
      const jinja_value rendered = jinja_value::string(render_block(node.body, scope));
      return apply_filter(rendered, *node.children[0], scope);
    }
    case nk::member: return evaluate_member(node, scope);
    case nk::call: return evaluate_call(node, scope);
    case nk::binary: return evaluate_binary(node, scope);
    case nk::unary: return evaluate_unary(node, scope);
    case nk::filter: return apply_filter(evaluate(*node.children[0], scope), *node.children[1], scope);
    case nk::test: return evaluate_test(node, scope);
    case nk::select: {
      if (!evaluate(*node.children[1], scope).truthy()) return {};
      return evaluate(*node.children[0], scope);
    }
    case nk::ternary: {
      const bool cond = evaluate(*node.children[0], scope).truthy();
      return evaluate(*node.children[cond ? 1 : 2], scope);
    }
    case nk::slice:
    case nk::keyword_argument: throw jinja_runtime_error("Unexpected expression outside of a call or subscript");
  }
  throw jinja_runtime_error("Unknown node type");
}

jinja_value jinja_interpreter::evaluate_binary(const jinja_node& node, jinja_scope& scope) {
  const std::string& op = node.text;
  const jinja_value left = evaluate(*node.children[0], scope);
  if (op == "and") return left.truthy() ? evaluate(*node.children[1], scope) : left;
  if (op == "or") return left.truthy() ? left : evaluate(*node.children[1], scope);

  const jinja_value right = evaluate(*node.children[1], scope);
  if (op == "==") return jinja_value::boolean(left.loose_equals(right));
  if (op == "!=") return jinja_value::boolean(!left.loose_equals(right));

  const bool membership = op == "in" || op == "not in";
  if (left.is_undefined() || right.is_undefined()) {
    // `anything in undefined` is false, as in the reference; every other use is an error.
    if (right.is_undefined() && membership) return jinja_value::boolean(op == "not in");
    throw jinja_runtime_error("Cannot perform operation " + op + " on undefined values");
  }
  if (left.is_none() || right.is_none()) throw jinja_runtime_error("Cannot perform operation on null values");
  if (op == "~") return jinja_value::string(left.to_concat() + right.to_concat());

  if (op == "**" && numeric_like(left) && numeric_like(right)) {
    const double a = left.as_number(), b = right.as_number();
    if (a == 0 && b < 0) throw jinja_runtime_error("0.0 cannot be raised to a negative power");
    const double result = std::pow(a, b);
    if (!std::isfinite(result)) throw jinja_runtime_error("Exponentiation result is not a finite real number");
    const bool is_float = left.kind() == jinja_kind::floating || right.kind() == jinja_kind::floating || b < 0;
    return is_float ? jinja_value::floating(result) : jinja_value::integer(static_cast<std::int64_t>(result));
  } else if (left.is_number() && right.is_number()) {
    const bool is_float = left.kind() == jinja_kind::floating || right.kind() == jinja_kind::floating;
    if (op == "+" || op == "-" || op == "*") {
      if (!is_float) {
        const std::int64_t a = left.as_int(), b = right.as_int();
        return jinja_value::integer(op == "+" ? a + b : op == "-" ? a - b : a * b);
      }
      const double a = left.as_number(), b = right.as_number();
      return jinja_value::floating(op == "+" ? a + b : op == "-" ? a - b : a * b);
    }
    const double a = left.as_number(), b = right.as_number();
    if (op == "/") return jinja_value::floating(a / b);
    if (op == "//") {
      if (!is_float && b == 0) throw jinja_runtime_error("integer division by zero");
      const double r = std::floor(a / b);
      return is_float ? jinja_value::floating(r) : jinja_value::integer(static_cast<std::int64_t>(r));
    }
    if (op == "%") {
      if (!is_float) {
        if (right.as_int() == 0) throw jinja_runtime_error("integer modulo by zero");
        return jinja_value::integer(left.as_int() % right.as_int());  // sign of the dividend, as in JavaScript
      }
      return jinja_value::floating(std::fmod(a, b));
    }
    if (op == "<") return jinja_value::boolean(a < b);
    if (op == ">") return jinja_value::boolean(a > b);
    if (op == ">=") return jinja_value::boolean(a >= b);
    if (op == "<=") return jinja_value::boolean(a <= b);
  } else if (left.is_array() && right.is_array()) {
    if (op == "+") {
      jinja_array joined = left.items();
      joined.insert(joined.end(), right.items().begin(), right.items().end());
      return jinja_value::array(std::move(joined));
    }
  } else if (right.is_array()) {
    bool member = false;
    for (const auto& item : right.items())
      if (item.strict_equals(left)) {
        member = true;
        break;
      }
    if (op == "in") return jinja_value::boolean(member);
    if (op == "not in") return jinja_value::boolean(!member);
  }

  if ((left.is_string() || right.is_string()) && op == "+") {
    return jinja_value::string(left.to_concat() + right.to_concat());
  }
  if (left.is_string() && right.is_string() && membership) {
    const bool found = right.as_string().find(left.as_string()) != std::string::npos;
    return jinja_value::boolean(op == "in" ? found : !found);
  }
  if (left.is_string() && right.is_object() && membership) {
    const bool found = right.fields().find(left.as_string()) != nullptr;
    return jinja_value::boolean(op == "in" ? found : !found);
  }
  throw jinja_runtime_error("Unknown operator \"" + op + "\" between " + left.type_name() + " and " +
                            right.type_name());
}

jinja_value jinja_interpreter::evaluate_unary(const jinja_node& node, jinja_scope& scope) {
  const jinja_value argument = evaluate(*node.children[0], scope);
  if (node.text == "not") return jinja_value::boolean(!argument.truthy());
  if (numeric_like(argument)) {
    const int sign = node.text == "-" ? -1 : 1;
    if (argument.kind() == jinja_kind::floating) return jinja_value::floating(sign * argument.as_number());
    const std::int64_t v = argument.kind() == jinja_kind::boolean ? (argument.as_bool() ? 1 : 0) : argument.as_int();
    return jinja_value::integer(sign * v);
  }
  throw jinja_runtime_error("Unknown operator \"" + node.text + "\" for " + argument.type_name());
}

jinja_value jinja_interpreter::evaluate_slice(const jinja_value& object, const jinja_node& slice, jinja_scope& scope) {
  if (!(object.is_array() || object.is_string())) throw jinja_runtime_error("Slice object must be an array or string");
  jinja_value parts[3];
  const char* names[3] = {"start", "stop", "step"};
  for (int i = 0; i < 3; ++i) {
    if (const jinja_node* c = slice.child(i)) parts[i] = evaluate(*c, scope);
    if (!(parts[i].kind() == jinja_kind::integer || parts[i].is_undefined())) {
      throw jinja_runtime_error(std::string("Slice ") + names[i] + " must be numeric or undefined");
    }
  }
  if (object.is_array()) {
    const auto& items = object.items();
    jinja_array out;
    for (std::size_t i : slice_indices(items.size(), parts[0], parts[1], parts[2])) out.push_back(items[i]);
    return jinja_value::array(std::move(out));
  }
  const auto cps = js::decode_utf8(object.as_string());
  std::string out;
  for (std::size_t i : slice_indices(cps.size(), parts[0], parts[1], parts[2])) utf8::append(out, cps[i]);
  return jinja_value::string(std::move(out));
}

jinja_value jinja_interpreter::evaluate_member(const jinja_node& node, jinja_scope& scope) {
  const jinja_value object = evaluate(*node.children[0], scope);
  const jinja_node& prop = *node.children[1];
  jinja_value property;
  if (node.flag) {
    if (prop.kind == nk::slice) return evaluate_slice(object, prop, scope);
    property = evaluate(prop, scope);
  } else if (prop.kind == nk::integer_literal) {
    property = jinja_value::integer(prop.integer);
  } else {
    property = jinja_value::string(prop.text);
  }

  if (object.is_attribute_container()) {
    if (!property.is_string())
      throw jinja_runtime_error("Cannot access property with non-string: got " + property.type_name());
    if (const jinja_value* found = object.fields().find(property.as_string())) return *found;
    return object.is_object() ? member_builtin(object, property.as_string()) : jinja_value();
  }
  if (object.is_array() || object.is_string()) {
    if (property.kind() == jinja_kind::integer) {
      std::int64_t index = property.as_int();
      if (object.is_array()) {
        const auto n = static_cast<std::int64_t>(object.items().size());
        if (index < 0) index += n;
        if (index < 0 || index >= n) return {};
        return object.items()[static_cast<std::size_t>(index)];
      }
      const auto cps = js::decode_utf8(object.as_string());
      const auto n = static_cast<std::int64_t>(cps.size());
      if (index < 0) index += n;
      if (index < 0 || index >= n) return {};
      std::string ch;
      utf8::append(ch, cps[static_cast<std::size_t>(index)]);
      return jinja_value::string(std::move(ch));
    }
    if (property.is_string()) return member_builtin(object, property.as_string());
    throw jinja_runtime_error("Cannot access property with non-string/non-number: got " + property.type_name());
  }
  if (!property.is_string())
    throw jinja_runtime_error("Cannot access property with non-string: got " + property.type_name());
  return member_builtin(object, property.as_string());
}

jinja_call_args jinja_interpreter::evaluate_arguments(const std::vector<jinja_node_ptr>& args, std::size_t first,
                                                      jinja_scope& scope) {
  jinja_call_args out;
  for (std::size_t i = first; i < args.size(); ++i)
    if (args[i]->kind != nk::keyword_argument) out.positional.push_back(evaluate(*args[i], scope));
  for (std::size_t i = first; i < args.size(); ++i) {
    if (args[i]->kind != nk::keyword_argument) continue;
    const std::string& key = args[i]->text;
    if (out.kwarg(key)) throw jinja_runtime_error("Got multiple values for keyword argument '" + key + "'");
    out.keyword.emplace_back(key, evaluate(*args[i]->children[0], scope));
  }
  return out;
}

jinja_value jinja_interpreter::evaluate_call(const jinja_node& node, jinja_scope& scope) {
  jinja_call_args args = evaluate_arguments(node.children, 1, scope);
  const jinja_value fn = evaluate(*node.children[0], scope);
  if (fn.kind() != jinja_kind::function) {
    throw jinja_runtime_error("Cannot call something that is not a function: got " + fn.type_name());
  }
  jinja_scope* saved = call_scope_;
  call_scope_ = &scope;
  struct restore {
    jinja_scope*& slot;
    jinja_scope* value;
    ~restore() { slot = value; }
  } guard{call_scope_, saved};
  return fn.callable()(args);
}

jinja_value jinja_interpreter::evaluate_test(const jinja_node& node, jinja_scope& scope) {
  const jinja_value operand = evaluate(*node.children[0], scope);
  if (!has_test(node.text)) throw jinja_runtime_error("Unknown test: " + node.text);
  const bool result = run_test(node.text, operand);
  return jinja_value::boolean(node.flag ? !result : result);
}

jinja_value jinja_interpreter::evaluate_set(const jinja_node& node, jinja_scope& scope) {
  const jinja_node& target = *node.children[0];
  const jinja_node* value_node = node.child(1);
  const jinja_value rhs =
      value_node ? evaluate(*value_node, scope) : jinja_value::string(render_block(node.body, scope));
  if (target.kind == nk::identifier) {
    scope.set(target.text, rhs);
  } else if (target.kind == nk::tuple_literal) {
    if (!rhs.is_array()) throw jinja_runtime_error("Cannot unpack non-iterable type in set: " + rhs.type_name());
    const auto& items = rhs.items();
    if (items.size() != target.children.size()) {
      throw jinja_runtime_error(std::string("Too ") + (target.children.size() > items.size() ? "few" : "many") +
                                " items to unpack in set");
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      const jinja_node& elem = *target.children[i];
      if (elem.kind != nk::identifier) throw jinja_runtime_error("Cannot unpack to non-identifier in set");
      scope.set(elem.text, items[i]);
    }
  } else if (target.kind == nk::member) {
    const jinja_value object = evaluate(*target.children[0], scope);
    if (object.kind() != jinja_kind::ns) throw jinja_runtime_error("cannot assign attribute on non-namespace object");
    const jinja_node& prop = *target.children[1];
    if (target.flag || prop.kind != nk::identifier) {
      throw jinja_runtime_error("Cannot assign to member with non-identifier property");
    }
    object.fields().set(prop.text, rhs);
  } else {
    throw jinja_runtime_error("Invalid LHS inside assignment expression");
  }
  return jinja_value::none();
}

std::string jinja_interpreter::evaluate_for(const jinja_node& node, jinja_scope& outer) {
  jinja_scope scope(&outer);
  const jinja_node& loop_var = *node.children[0];
  const jinja_node& iterable_node = *node.children[1];
  const jinja_node* condition = nullptr;
  jinja_value iterable;
  if (iterable_node.kind == nk::select) {
    iterable = evaluate(*iterable_node.children[0], scope);
    condition = iterable_node.children[1].get();
  } else {
    iterable = evaluate(iterable_node, scope);
  }
  if (!(iterable.is_array() || iterable.is_object())) {
    throw jinja_runtime_error("Expected iterable or object type in for loop: got " + iterable.type_name());
  }
  jinja_array candidates;
  if (iterable.is_object()) {
    for (const auto& entry : iterable.fields().entries) candidates.push_back(jinja_value::string(entry.first));
  } else {
    candidates = iterable.items();
  }

  auto bind = [&](jinja_scope& target, const jinja_value& current) {
    if (loop_var.kind == nk::identifier) {
      target.set(loop_var.text, current);
      return;
    }
    if (!current.is_array()) throw jinja_runtime_error("Cannot unpack non-iterable type: " + current.type_name());
    const auto& parts = current.items();
    if (parts.size() != loop_var.children.size()) {
      throw jinja_runtime_error(std::string("Too ") + (loop_var.children.size() > parts.size() ? "few" : "many") +
                                " items to unpack");
    }
    for (std::size_t j = 0; j < parts.size(); ++j) {
      if (loop_var.children[j]->kind != nk::identifier) throw jinja_runtime_error("Cannot unpack non-identifier type");
      target.set(loop_var.children[j]->text, parts[j]);
    }
  };

  // `for x in xs if cond` filters first, so loop.index and loop.last count only kept items.
  jinja_array items;
  for (const auto& current : candidates) {
    if (condition) {
      jinja_scope test_scope(&scope);
      bind(test_scope, current);
      if (!evaluate(*condition, test_scope).truthy()) continue;
    }
    items.push_back(current);
  }

  std::string out;
  bool no_iteration = true;
  const auto n = static_cast<std::int64_t>(items.size());
  for (std::int64_t i = 0; i < n; ++i) {
    jinja_object loop;
    loop.entries.reserve(9);
    loop.entries.emplace_back("index", jinja_value::integer(i + 1));
    loop.entries.emplace_back("index0", jinja_value::integer(i));
    loop.entries.emplace_back("revindex", jinja_value::integer(n - i));
    loop.entries.emplace_back("revindex0", jinja_value::integer(n - i - 1));
    loop.entries.emplace_back("first", jinja_value::boolean(i == 0));
    loop.entries.emplace_back("last", jinja_value::boolean(i == n - 1));
    loop.entries.emplace_back("length", jinja_value::integer(n));
    loop.entries.emplace_back("previtem", i > 0 ? items[i - 1] : jinja_value());
    loop.entries.emplace_back("nextitem", i < n - 1 ? items[i + 1] : jinja_value());
    scope.set("loop", jinja_value::object(std::move(loop)));
    bind(scope, items[i]);
    try {
      out += render_block(node.body, scope);
    } catch (const continue_signal&) {
      continue;
    } catch (const break_signal&) {
      break;
    }
    no_iteration = false;
  }
  if (no_iteration) out += render_block(node.alternate, scope);
  return out;
}

jinja_value jinja_interpreter::define_macro(const jinja_node& node, jinja_scope& scope) {
  const jinja_node* macro = &node;
  scope.set(node.text, jinja_value::function([this, macro](const jinja_call_args& args) {
              jinja_scope local(call_scope_);
              const auto& params = macro->children;
              std::vector<std::pair<std::string, const jinja_node*>> pending_defaults;
              std::vector<bool> used(args.keyword.size(), false);
              for (std::size_t i = 0; i < params.size(); ++i) {
                const jinja_node& p = *params[i];
                jinja_value value;
                bool bound = false;
                if (i < args.positional.size()) {
                  value = args.positional[i];
                  bound = true;
                } else {
                  for (std::size_t k = 0; k < args.keyword.size(); ++k) {
                    if (args.keyword[k].first == p.text) {
                      value = args.keyword[k].second;
                      used[k] = true;
                      bound = true;
                    }
                  }
                }
                if (!bound && p.kind == nk::keyword_argument)
                  pending_defaults.emplace_back(p.text, p.children[0].get());
                local.set(p.text, value);
              }
              for (std::size_t k = 0; k < args.keyword.size(); ++k) {
                if (!used[k]) {
                  throw jinja_runtime_error("macro '" + macro->text + "' takes no keyword argument '" +
                                            args.keyword[k].first + "'");
                }
              }
              if (args.positional.size() > params.size()) {
                throw jinja_runtime_error("macro '" + macro->text + "' takes not more than " +
                                          std::to_string(params.size()) + " argument(s)");
              }
              for (const auto& [name, default_node] : pending_defaults) local.set(name, evaluate(*default_node, local));
              return jinja_value::string(render_block(macro->body, local));
            }));
  return jinja_value::none();
}

}  // namespace troupe
