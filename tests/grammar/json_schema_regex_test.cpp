#include "grammar/json_schema_regex.hpp"

#include <gtest/gtest.h>

#include "grammar/byte_dfa.hpp"
#include "grammar/grammar_error.hpp"

namespace troupe {
namespace {

byte_dfa schema_dfa(const char* schema) {
  return byte_dfa::compile(json_schema_to_regex(nlohmann::ordered_json::parse(schema)));
}

std::string refusal(const char* schema) {
  try {
    schema_dfa(schema);
  } catch (const grammar_error& e) {
    return e.what();
  }
  return "(compiled)";
}

TEST(json_schema_regex, object_properties_come_in_schema_order_with_optional_ones_left_out) {
  const byte_dfa dfa = schema_dfa(R"({"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"boolean"},
      "m":{"type":"string"}},"required":["a"]})");
  EXPECT_TRUE(dfa.matches(R"({"z":1,"a":true,"m":"x"})"));
  EXPECT_TRUE(dfa.matches(R"({"a":false})"));
  EXPECT_TRUE(dfa.matches(R"({"a":false,"m":""})"));
  EXPECT_FALSE(dfa.matches(R"({"z":1})"));           // a is required
  EXPECT_FALSE(dfa.matches(R"({"a":true,"z":1})"));  // the schema's order
  EXPECT_FALSE(dfa.matches(R"({ "a":true})"));       // no whitespace
}

TEST(json_schema_regex, all_optional_properties_place_their_commas_right) {
  const byte_dfa dfa = schema_dfa(R"({"properties":{"a":{"const":1},"b":{"const":2},"c":{"const":3}}})");
  for (const char* ok : {"{}", R"({"a":1})", R"({"b":2})", R"({"a":1,"c":3})", R"({"a":1,"b":2,"c":3})"}) {
    EXPECT_TRUE(dfa.matches(ok)) << ok;
  }
  for (const char* bad : {R"({,"b":2})", R"({"a":1,})", R"({"b":2,"a":1})"}) EXPECT_FALSE(dfa.matches(bad)) << bad;
}

TEST(json_schema_regex, arrays_keep_their_item_bounds) {
  const byte_dfa dfa = schema_dfa(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})");
  EXPECT_FALSE(dfa.matches("[]"));
  EXPECT_TRUE(dfa.matches("[1]"));
  EXPECT_TRUE(dfa.matches("[1,-2,30]"));
  EXPECT_FALSE(dfa.matches("[1,2,3,4]"));
  EXPECT_TRUE(schema_dfa(R"({"type":"array","items":{"type":"null"}})").matches("[]"));
}

TEST(json_schema_regex, strings_keep_lengths_patterns_formats_and_escapes) {
  const byte_dfa sized = schema_dfa(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_FALSE(sized.matches(R"("a")"));
  EXPECT_TRUE(sized.matches(R"("ab")"));
  EXPECT_TRUE(sized.matches(R"("a\"é")"));  // three characters, one of them escaped
  EXPECT_FALSE(sized.matches(R"("abcd")"));
  EXPECT_FALSE(sized.matches("\"a\nb\""));  // a raw control character is not JSON
  const byte_dfa pattern = schema_dfa(R"({"type":"string","pattern":"^[A-Z]{2}-[0-9]+$"})");
  EXPECT_TRUE(pattern.matches(R"("AB-12")"));
  EXPECT_FALSE(pattern.matches(R"("AB-")"));
  const byte_dfa unanchored = schema_dfa(R"({"type":"string","pattern":"ab"})");
  EXPECT_TRUE(unanchored.matches(R"("xxabyy")"));
  EXPECT_FALSE(unanchored.matches(R"("xxa")"));
  const byte_dfa date = schema_dfa(R"({"type":"string","format":"date"})");
  EXPECT_TRUE(date.matches(R"("2024-02-28")"));
  EXPECT_FALSE(date.matches(R"("2024-13-01")"));
}

TEST(json_schema_regex, integer_ranges_are_exact) {
  struct range_case {
    std::optional<int64_t> lo, hi;
  };
  for (const range_case& r :
       {range_case{-15, 123}, range_case{7, 7}, range_case{0, 1000}, range_case{-1000, -10},
        range_case{95, std::nullopt}, range_case{std::nullopt, -3}, range_case{std::nullopt, 42}}) {
    const byte_dfa dfa = byte_dfa::compile(integer_range_regex(r.lo, r.hi));
    for (int64_t v = -1500; v <= 1500; ++v) {
      const bool inside = (!r.lo || v >= *r.lo) && (!r.hi || v <= *r.hi);
      ASSERT_EQ(dfa.matches(std::to_string(v)), inside)
          << v << " in [" << r.lo.value_or(-999999) << ", " << r.hi.value_or(999999) << "]";
    }
    EXPECT_FALSE(dfa.matches("-0"));
    EXPECT_FALSE(dfa.matches("007"));
  }
}

TEST(json_schema_regex, number_bounds_hold_for_fractions_and_exclusive_ends) {
  const byte_dfa dfa = schema_dfa(R"({"type":"number","exclusiveMinimum":-2,"maximum":3.5})");
  EXPECT_TRUE(dfa.matches("-1.99"));
  EXPECT_TRUE(dfa.matches("3"));
  EXPECT_TRUE(dfa.matches("2.75"));
  EXPECT_TRUE(dfa.matches("0"));
  EXPECT_FALSE(dfa.matches("-2"));
  EXPECT_FALSE(dfa.matches("-2.5"));
  EXPECT_FALSE(dfa.matches("4"));
  EXPECT_FALSE(dfa.matches("3.9"));   // approximated away: no fraction above the last whole unit
  EXPECT_FALSE(dfa.matches("1.50"));  // a fraction never ends in 0 (so it is never a bound itself)
}

TEST(json_schema_regex, enums_consts_anyof_refs_and_nullable_types) {
  const byte_dfa dfa =
      schema_dfa(R"({"$defs":{"p":{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}},
      "anyOf":[{"$ref":"#/$defs/p"},{"enum":["a b",3,null,{"k":[1]}]},{"type":["boolean","null"]}]})");
  for (const char* ok : {R"({"x":5})", R"("a b")", "3", "null", R"({"k":[1]})", "true"})
    EXPECT_TRUE(dfa.matches(ok)) << ok;
  EXPECT_FALSE(dfa.matches(R"("a")"));
}

TEST(json_schema_regex, any_json_object_nests_to_its_depth) {
  const byte_dfa dfa = byte_dfa::compile(json_object_regex(2));
  EXPECT_TRUE(dfa.matches(R"({"a":{"b":null},"c":[1,"x",-1.5e3]})"));
  EXPECT_FALSE(dfa.matches(R"({"a":{"b":[1]}})"));  // three deep
  EXPECT_FALSE(dfa.matches("[1]"));                 // an object, not any value
}

TEST(json_schema_regex, refuses_unsupported_parts_naming_where_they_are) {
  EXPECT_NE(refusal(R"({"properties":{"a":{"type":"string","minLength":1,"not":{}}}})")
                .find("$.properties.a: the keyword \"not\""),
            std::string::npos);
  EXPECT_NE(
      refusal(R"({"$defs":{"n":{"properties":{"next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"})").find("recursive"),
      std::string::npos);
  EXPECT_NE(refusal(R"({"type":"integer","minimum":5,"maximum":3})").find("no value"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","format":"hostname"})").find("\"hostname\""), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"array","uniqueItems":true})").find("uniqueItems"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"strin"})").find("unknown type \"strin\""), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","required":["b"],"properties":{"a":{}}})").find("\"b\" is not in properties"),
            std::string::npos);
}

}  // namespace
}  // namespace troupe
