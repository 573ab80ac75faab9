#include "grammar/grammar_matcher.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "grammar/guided_grammar.hpp"

namespace troupe {
namespace {

// A vocabulary like a small BPE one: every byte alone, some longer pieces, two special tokens.
std::shared_ptr<const token_vocabulary> small_vocabulary() {
  std::vector<std::string> bytes;
  bytes.push_back("");  // 0: <unk>
  bytes.push_back("");  // 1: EOS
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* piece : {"{\"", "\":", "\",\"", "true", "false", "null", "abc", "12", "}\n", "\"}", "name", "ab"}) {
    bytes.push_back(piece);
  }
  return std::make_shared<token_vocabulary>(std::move(bytes), std::vector<int32_t>{1});
}

std::shared_ptr<token_masks> masks_for(const guided_decoding& g) {
  return std::make_shared<token_masks>(compile_guided(g), small_vocabulary());
}

guided_decoding regex(const char* pattern) { return {guided_kind::regex, pattern, {}}; }

std::string bytes_of(const token_vocabulary& v, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += v.bytes(id);
  return out;
}

TEST(token_masks, allow_exactly_the_tokens_the_automaton_accepts) {
  auto masks = masks_for(regex("ab(c|d)"));
  const auto& vocabulary = masks->vocabulary();
  const auto& start = masks->at(masks->dfa().start());
  std::vector<std::string> allowed;
  for (int32_t id : start.token_ids) allowed.push_back(vocabulary.bytes(id));
  std::sort(allowed.begin(), allowed.end());
  EXPECT_EQ(allowed, (std::vector<std::string>{"a", "ab", "abc"}));
  // Brute force over the whole vocabulary agrees, in every reachable state.
  for (const char* prefix : {"", "a", "ab"}) {
    const int32_t state = masks->dfa().walk(masks->dfa().start(), prefix);
    const auto& mask = masks->at(state);
    for (int32_t id = 0; id < vocabulary.size(); ++id) {
      const bool accepted = !vocabulary.bytes(id).empty() && !vocabulary.is_end(id) &&
                            masks->dfa().walk(state, vocabulary.bytes(id)) != byte_dfa::dead;
      const bool listed = std::find(mask.token_ids.begin(), mask.token_ids.end(), id) != mask.token_ids.end();
      EXPECT_EQ(accepted, listed) << "token " << id << " after '" << prefix << "'";
    }
  }
  EXPECT_EQ(masks->num_states_computed(), 3u);  // computed once per state reached
}

TEST(grammar_matcher, eos_only_where_the_grammar_accepts) {
  grammar_matcher m(masks_for(regex("[0-9]+")));
  auto has_eos = [&](int left) {
    auto allowed = m.allowed(left);
    return std::find(allowed.begin(), allowed.end(), 1) != allowed.end();
  };
  EXPECT_FALSE(has_eos(100));
  EXPECT_FALSE(m.advance(1));
  ASSERT_TRUE(m.advance(2 + '7'));
  EXPECT_TRUE(has_eos(100));
  EXPECT_FALSE(m.advance(2 + 'x'));
  EXPECT_TRUE(m.advance(1));
  EXPECT_TRUE(m.ended());
}

// With any choice among the allowed tokens (random weights), the output is complete and ended by
// EOS by the time max_tokens runs out, and EOS ends it only when it is complete.
void expect_always_complete(const guided_decoding& g, int max_tokens, int runs) {
  auto masks = masks_for(g);
  std::mt19937 rng(7);
  for (int run = 0; run < runs; ++run) {
    grammar_matcher m(masks);
    std::vector<int32_t> out;
    for (int i = 0; i < max_tokens && !m.ended(); ++i) {
      auto allowed = m.allowed(max_tokens - i);
      ASSERT_FALSE(allowed.empty());
      const int32_t token = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      ASSERT_TRUE(m.advance(token));
      if (!m.ended()) out.push_back(token);
    }
    EXPECT_TRUE(masks->dfa().matches(bytes_of(masks->vocabulary(), out)))
        << "run " << run << ": '" << bytes_of(masks->vocabulary(), out) << "'";
    EXPECT_TRUE(m.ended()) << "run " << run << ": no EOS within max_tokens";
  }
}

TEST(grammar_matcher, the_length_rule_completes_every_output_in_time) {
  expect_always_complete({guided_kind::json_schema,
                          R"({"type":"object","properties":{"name":{"type":"string"},"tags":{"type":"array",
                             "items":{"type":"string"}},"n":{"type":"number"}},"required":["name","tags","n"]})",
                          {}},
                         41, 200);
  expect_always_complete({guided_kind::json_object, "", {}}, 12, 200);
  expect_always_complete(regex("(ab|c)+d{2,}"), 5, 200);
}

TEST(grammar_matcher, a_choice_is_one_of_its_strings) {
  auto masks = masks_for({guided_kind::choice, "", {"yes", "no", "maybe so"}});
  std::mt19937 rng(3);
  for (int run = 0; run < 50; ++run) {
    grammar_matcher m(masks);
    std::vector<int32_t> out;
    for (int i = 0; i < 20 && !m.ended(); ++i) {
      auto allowed = m.allowed(20 - i);
      const int32_t token = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      ASSERT_TRUE(m.advance(token));
      if (!m.ended()) out.push_back(token);
    }
    const std::string text = bytes_of(masks->vocabulary(), out);
    EXPECT_TRUE(text == "yes" || text == "no" || text == "maybe so") << text;
  }
}

TEST(guided_grammar, the_door_check_names_what_cannot_be_compiled_and_a_too_small_max_tokens) {
  sampling_params p;
  p.max_tokens = 100;
  p.guided = {
      guided_kind::json_schema, R"js({"type":"object","properties":{"a":{"type":"string","pattern":"(?<=x)"}}})js", {}};
  auto problem = check_guided_decoding(p);
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->field, "guided_json");
  EXPECT_NE(problem->problem.find("$.properties.a.pattern"), std::string::npos) << problem->problem;
  p.guided = {guided_kind::json_schema, "{not json", {}};
  ASSERT_TRUE(check_guided_decoding(p));
  EXPECT_NE(check_guided_decoding(p)->problem.find("not valid JSON"), std::string::npos);
  p.guided = {guided_kind::choice, "", {"a long answer"}};
  p.max_tokens = 5;
  ASSERT_TRUE(check_guided_decoding(p));
  EXPECT_EQ(check_guided_decoding(p)->field, "max_tokens");
  p.max_tokens = 13;  // its 13 bytes, but no room for the EOS after them
  ASSERT_TRUE(check_guided_decoding(p));
  p.max_tokens = 14;
  EXPECT_FALSE(check_guided_decoding(p));
}

}  // namespace
}  // namespace troupe
