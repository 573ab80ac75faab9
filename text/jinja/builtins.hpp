#pragma once

#include <string>

#include "text/jinja/value.hpp"

namespace troupe {

class jinja_scope;

// What `value.name` finds when `value` has no such key: string methods (strip, split,
// startswith, ...), dict methods (get, items, keys, values, dictsort) and `length`.
// Undefined when there is none.
jinja_value member_builtin(const jinja_value& object, const std::string& name);

// `x is name` and the tests selectattr/rejectattr use. `argument` is the test's second operand
// (selectattr("role", "equalto", "user")), undefined when absent.
bool has_test(const std::string& name);
bool run_test(const std::string& name, const jinja_value& operand, const jinja_value& argument = {});

// Ordering used by sort and dictsort: numbers (and booleans) among themselves, strings among
// themselves (case-insensitive unless asked), anything else is an error. Returns -1, 0 or 1.
int compare_values(const jinja_value& a, const jinja_value& b, bool case_sensitive);

// Global names every template sees: true/false/none (and True/False/None), raise_exception,
// range, namespace, strftime_now.
void install_globals(jinja_scope& scope);

}  // namespace troupe
