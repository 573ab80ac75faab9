#pragma once

#include <string>
#include <unordered_map>

#include "text/jinja/ast.hpp"
#include "text/jinja/value.hpp"

namespace troupe {

// One level of variables. A for loop opens one, a macro call opens one; `set` writes to the
// innermost, so a variable set inside a loop is gone after it (use namespace() to carry state).
class jinja_scope {
 public:
  explicit jinja_scope(const jinja_scope* parent = nullptr) : parent_(parent) {}

  void set(const std::string& name, jinja_value value) { variables_[name] = std::move(value); }
  bool has_own(const std::string& name) const { return variables_.count(name) != 0; }
  jinja_value lookup(const std::string& name) const;  // undefined when no scope has it

 private:
  const jinja_scope* parent_;
  std::unordered_map<std::string, jinja_value> variables_;
};

// Evaluates a parsed template. Semantics follow @huggingface/jinja, including its error
// messages, which are thrown as jinja_runtime_error.
class jinja_interpreter {
 public:
  std::string render(const jinja_node& program, jinja_scope& globals);

 private:
  jinja_value evaluate(const jinja_node& node, jinja_scope& scope);
  std::string render_block(const std::vector<jinja_node_ptr>& statements, jinja_scope& scope);

  jinja_value evaluate_binary(const jinja_node& node, jinja_scope& scope);
  jinja_value evaluate_unary(const jinja_node& node, jinja_scope& scope);
  jinja_value evaluate_member(const jinja_node& node, jinja_scope& scope);
  jinja_value evaluate_slice(const jinja_value& object, const jinja_node& slice, jinja_scope& scope);
  jinja_value evaluate_call(const jinja_node& node, jinja_scope& scope);
  jinja_value evaluate_test(const jinja_node& node, jinja_scope& scope);
  jinja_value evaluate_set(const jinja_node& node, jinja_scope& scope);
  std::string evaluate_for(const jinja_node& node, jinja_scope& scope);
  jinja_value define_macro(const jinja_node& node, jinja_scope& scope);
  jinja_call_args evaluate_arguments(const std::vector<jinja_node_ptr>& args, std::size_t first, jinja_scope& scope);

  // Filters live in jinja_filters.cpp.
  jinja_value apply_filter(const jinja_value& operand, const jinja_node& filter, jinja_scope& scope);
  jinja_value apply_plain_filter(const jinja_value& operand, const std::string& name);
  jinja_value apply_call_filter(const jinja_value& operand, const jinja_node& call, jinja_scope& scope);

  // The scope a function is being called from: macros run in a child of it, as in the reference.
  jinja_scope* call_scope_ = nullptr;
};

}  // namespace troupe
