#include "grammar/byte_dfa.hpp"

#include <gtest/gtest.h>

#include <regex>

#include "grammar/grammar_error.hpp"

namespace troupe {
namespace {

TEST(byte_dfa, matches_literals_classes_and_quantifiers) {
  const byte_dfa dfa = byte_dfa::compile("a[0-9]{2,3}(x|yz)*");
  EXPECT_TRUE(dfa.matches("a12"));
  EXPECT_TRUE(dfa.matches("a123xyzx"));
  EXPECT_FALSE(dfa.matches("a1"));
  EXPECT_FALSE(dfa.matches("a1234"));
  EXPECT_FALSE(dfa.matches("a12y"));
  EXPECT_FALSE(dfa.matches(""));
}

TEST(byte_dfa, anchors_at_the_ends_are_accepted_and_mean_the_whole_output) {
  const byte_dfa dfa = byte_dfa::compile("^ab+$");
  EXPECT_TRUE(dfa.matches("abbb"));
  EXPECT_FALSE(dfa.matches("a"));
}

TEST(byte_dfa, encodes_unicode_classes_as_utf8) {
  const byte_dfa dfa = byte_dfa::compile("[α-ω]+é");
  EXPECT_TRUE(dfa.matches("αβωé"));
  EXPECT_FALSE(dfa.matches("aé"));
  // A negated class and '.' take any character as its whole UTF-8 sequence, never half of one.
  const byte_dfa any = byte_dfa::compile("[^a]");
  EXPECT_TRUE(any.matches("€"));
  EXPECT_TRUE(any.matches("😀"));
  EXPECT_FALSE(any.matches("\xE2\x82"));
  EXPECT_FALSE(any.matches("\xED\xA0\x80"));  // a surrogate is not a character
  EXPECT_TRUE(byte_dfa::compile(".").matches("\xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(byte_dfa::compile(".").matches("\n"));
}

TEST(byte_dfa, distance_counts_the_bytes_to_acceptance) {
  const byte_dfa dfa = byte_dfa::compile(R"(\{"a":[0-9]+\})");
  EXPECT_EQ(dfa.distance(dfa.start()), 7);  // {"a":0}
  const int32_t inside = dfa.walk(dfa.start(), R"({"a":12)");
  ASSERT_NE(inside, byte_dfa::dead);
  EXPECT_EQ(dfa.distance(inside), 1);
}

TEST(byte_dfa, agrees_with_std_regex_on_sampled_strings) {
  const char* patterns[] = {"(ab|a)*b?", "[a-c]{1,3}d|x+", "(a|b)(c|d)*e{0,2}", "a?b?c?"};
  const char* inputs[] = {"",    "a",   "ab",    "abab",    "b",   "abcd", "ccd",
                          "xxx", "ace", "acdee", "bdddeee", "abc", "ac",   "ba"};
  for (const char* pattern : patterns) {
    const byte_dfa dfa = byte_dfa::compile(pattern);
    const std::regex reference(pattern, std::regex::ECMAScript);
    for (const char* input : inputs) {
      EXPECT_EQ(dfa.matches(input), std::regex_match(input, reference)) << pattern << " on '" << input << "'";
    }
  }
}

TEST(byte_dfa, refuses_what_it_does_not_support_naming_it) {
  auto message = [](const char* pattern) {
    try {
      byte_dfa::compile(pattern);
    } catch (const grammar_error& e) {
      return std::string(e.what());
    }
    return std::string("(compiled)");
  };
  EXPECT_NE(message("(a)\\1").find("backreference"), std::string::npos);
  EXPECT_NE(message("(?=a)").find("lookaround"), std::string::npos);
  EXPECT_NE(message("a\\b").find("word boundaries"), std::string::npos);
  EXPECT_NE(message("a^b").find("anchor"), std::string::npos);
  EXPECT_NE(message("(ab").find("')'"), std::string::npos);
  EXPECT_NE(message("[^\\x{0}-\\x{10FFFF}]").find("matches nothing"), std::string::npos);
}

TEST(byte_dfa, refuses_a_grammar_beyond_its_state_bound) {
  EXPECT_THROW(byte_dfa::compile("[a-z]{0,500}x[a-z]{0,500}", /*max_states=*/300), grammar_error);
  EXPECT_NO_THROW(byte_dfa::compile("[a-z]{0,100}", /*max_states=*/300));
}

}  // namespace
}  // namespace troupe
