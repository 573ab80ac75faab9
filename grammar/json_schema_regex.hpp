#pragma once
// JSON schema -> regular expression (the approach of Outlines): the output is compact JSON (no
// whitespace at all, so that random weights cannot wander in blanks) whose shape the regex
// spells out.
//
// Supported: type (one or a list), object properties in the schema's order (required ones always,
// optional ones may be left out; no other properties are produced), arrays (items, minItems,
// maxItems), enum, const, strings (minLength, maxLength, pattern, format: date, time, date-time,
// uuid, email, ipv4), integers and numbers (minimum, maximum, exclusiveMinimum, exclusiveMaximum),
// boolean, null, anyOf, oneOf, allOf of one schema, $ref to #/$defs/... or #/definitions/...
// (not recursive), the boolean schema true, and the annotations (title, description, ...).
// Anything else is refused with a grammar_error naming where it is ("$.properties.tags: ...").
//
// Approximations (the output always validates; some valid documents are never produced):
// - no whitespace; strings use no \u escapes (other escapes \" \\ \/ \b \f \n \r \t are allowed);
// - numbers have at most 15 digits before the point and 15 after it, exponents at most 2 digits
//   (so every number is finite in any parser), integers at most 15 digits;
// - numbers with bounds have no exponent and at most 6 fraction digits, and a fraction only where
//   the whole unit interval lies within the bounds (with minimum 0.5 nothing below 1 is produced);
// - oneOf is produced like anyOf: alternatives that overlap can yield a value that matches two;
// - a pattern is matched against the string's raw characters and cannot produce '"', '\' or
//   control characters; a pattern together with minLength/maxLength is refused;
// - "format": date days are 01..28 (every month has them), times have no fraction.
// Strings and arrays without maxLength / maxItems are unbounded: the length rule of
// grammar_matcher ends them in time (see there), and a bound would only multiply states.

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace troupe {

// How deep `{"type": "json_object"}` (and a schema without a type) may nest objects and arrays.
inline constexpr int default_json_depth = 3;

// Throws grammar_error naming the unsupported or malformed part.
std::string json_schema_to_regex(const nlohmann::ordered_json& schema);

// Any JSON value whose objects and arrays nest at most `depth` deep (compact form).
std::string json_value_regex(int depth = default_json_depth);
// Any JSON object, its values nesting at most `depth - 1` deeper.
std::string json_object_regex(int depth = default_json_depth);

// The regex of the integers in [lo, hi] (no leading zeros; "-0" never), each bound optional.
std::string integer_range_regex(std::optional<int64_t> lo, std::optional<int64_t> hi);

}  // namespace troupe
