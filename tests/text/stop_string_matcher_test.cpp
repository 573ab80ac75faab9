// stop_string_matcher: matches that span any number of deltas, overlapping and multiple stop
// strings, a stop at the very start, UTF-8, the released tail, and a randomized check that the
// outcome never depends on how the text was cut into deltas.

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "text/stop_string_matcher.hpp"

namespace troupe {
namespace {

struct fed {
  std::string text;  // everything emitted, finish() included when no match
  bool matched = false;
  int matched_after = -1;  // index of the delta that completed the match
};

fed feed_all(stop_string_matcher& m, const std::vector<std::string>& deltas) {
  fed out;
  for (size_t i = 0; i < deltas.size(); ++i) {
    auto step = m.push(deltas[i]);
    out.text += step.text;
    if (step.matched && !out.matched) {
      out.matched = true;
      out.matched_after = static_cast<int>(i);
    }
  }
  out.text += m.finish();
  return out;
}

// The definition, on the whole text at once: the stop string that completes first (the longest
// on a tie), starting on a character boundary; the text ends before it.
std::string expected_output(const std::string& text, const std::vector<std::string>& stops, bool& matched) {
  size_t best_start = std::string::npos, best_end = std::string::npos;
  for (const auto& stop : stops) {
    for (size_t start = text.find(stop); start != std::string::npos; start = text.find(stop, start + 1)) {
      if ((static_cast<unsigned char>(text[start]) & 0xC0u) == 0x80u) continue;
      const size_t end = start + stop.size();
      if (best_end == std::string::npos || end < best_end || (end == best_end && start < best_start)) {
        best_start = start;
        best_end = end;
      }
      break;
    }
  }
  matched = best_start != std::string::npos;
  return matched ? text.substr(0, best_start) : text;
}

TEST(stop_string_matcher, no_stop_strings_pass_everything_through_at_once) {
  stop_string_matcher m;
  EXPECT_FALSE(m.active());
  auto step = m.push("Once upon");
  EXPECT_EQ(step.text, "Once upon");
  EXPECT_FALSE(step.matched);
  EXPECT_EQ(m.finish(), "");
}

TEST(stop_string_matcher, match_inside_one_delta_cuts_before_it) {
  stop_string_matcher m({"girl"});
  auto step = m.push("a little girl named Lily");
  EXPECT_TRUE(step.matched);
  EXPECT_EQ(step.text, "a little ");
  EXPECT_EQ(m.matched_index(), 0);
  EXPECT_EQ(m.push("more").text, "");
  EXPECT_FALSE(m.push("girl").matched);  // only one match is ever reported
  EXPECT_EQ(m.finish(), "");
}

TEST(stop_string_matcher, match_spanning_one_to_n_deltas) {
  const std::string stop = "named Lily";
  const std::string text = "a little girl named Lily. She";
  // Cut the stop string into n pieces for every n: the emitted text is the same each time and
  // nothing of "named Lily" ever leaves the matcher.
  for (size_t n = 1; n <= stop.size(); ++n) {
    std::vector<std::string> deltas = {"a little girl "};
    const size_t piece = (stop.size() + n - 1) / n;
    for (size_t at = 0; at < stop.size(); at += piece) deltas.push_back(stop.substr(at, piece));
    deltas.push_back(". She");
    stop_string_matcher m({stop});
    std::string emitted;
    bool matched = false;
    for (const auto& d : deltas) {
      auto step = m.push(d);
      emitted += step.text;
      EXPECT_EQ(emitted.find('n'), std::string::npos) << "emitted a prefix of the stop string, n=" << n;
      if (step.matched) {
        matched = true;
        break;
      }
    }
    EXPECT_TRUE(matched) << "n=" << n << " text " << text;
    EXPECT_EQ(emitted, "a little girl ") << "n=" << n;
  }
}

TEST(stop_string_matcher, holds_back_only_a_possible_start_of_a_stop_string) {
  stop_string_matcher m({"Lily."});
  auto a = m.push("named Li");
  EXPECT_EQ(a.text, "named ");
  EXPECT_EQ(m.num_held_bytes(), 2u);
  auto b = m.push("ly");
  EXPECT_EQ(b.text, "");
  EXPECT_EQ(m.num_held_bytes(), 4u);
  auto c = m.push(" and");  // "Lily " cannot become "Lily." any more: all of it goes out
  EXPECT_EQ(c.text, "Lily and");
  EXPECT_EQ(m.num_held_bytes(), 0u);
  EXPECT_FALSE(c.matched);
}

TEST(stop_string_matcher, a_false_start_releases_text_but_keeps_a_later_possible_start) {
  // Only the suffix that is still a prefix of "aab" is held: one "a" too many goes out.
  stop_string_matcher m({"aab"});
  EXPECT_EQ(m.push("xa").text, "x");
  EXPECT_EQ(m.push("a").text, "");   // "aa" could still become "aab"
  EXPECT_EQ(m.push("a").text, "a");  // "aaa": the first "a" can no longer start it, "aa" can
  auto last = m.push("b");
  EXPECT_TRUE(last.matched);
  EXPECT_EQ(last.text, "");
}

TEST(stop_string_matcher, stop_at_the_very_start) {
  stop_string_matcher m({"Once"});
  auto a = m.push("On");
  EXPECT_EQ(a.text, "");
  auto b = m.push("ce upon a time");
  EXPECT_TRUE(b.matched);
  EXPECT_EQ(b.text, "");
}

TEST(stop_string_matcher, overlapping_stop_strings_first_to_complete_wins) {
  {
    // "bc" completes at "abc", before "abcd" could: the text ends before "bc".
    stop_string_matcher m({"abcd", "bc"});
    EXPECT_EQ(feed_all(m, {"xa", "b", "c", "d"}).text, "xa");
    EXPECT_EQ(m.matched_index(), 1);
  }
  {
    // Both complete at the same byte: the longer one (it starts first) wins.
    stop_string_matcher m({"cd", "bcd"});
    auto r = feed_all(m, {"ab", "cd"});
    EXPECT_TRUE(r.matched);
    EXPECT_EQ(r.text, "a");
    EXPECT_EQ(m.matched_index(), 1);
  }
  {
    // A stop string overlapping itself: "aab" inside "aaab".
    stop_string_matcher m({"aab"});
    EXPECT_EQ(feed_all(m, {"aa", "a", "b", "tail"}).text, "a");
  }
}

TEST(stop_string_matcher, several_stop_strings_the_earliest_in_the_text_wins_whatever_the_order) {
  for (const auto& stops : std::vector<std::vector<std::string>>{{"park", "Lily"}, {"Lily", "park"}}) {
    stop_string_matcher m(stops);
    auto r = feed_all(m, {"a girl named Li", "ly. She played in the pa", "rk."});
    EXPECT_TRUE(r.matched);
    EXPECT_EQ(r.matched_after, 1);
    EXPECT_EQ(r.text, "a girl named ");
    EXPECT_EQ(stops[m.matched_index()], "Lily");
  }
}

TEST(stop_string_matcher, finish_releases_the_held_tail) {
  stop_string_matcher m({"Lily!"});
  auto a = m.push("her name was Lil");
  EXPECT_EQ(a.text, "her name was ");
  auto b = m.push("y");
  EXPECT_EQ(b.text, "");
  EXPECT_EQ(m.finish(), "Lily");
  EXPECT_EQ(m.finish(), "");
  EXPECT_FALSE(m.matched());
}

TEST(stop_string_matcher, utf8_characters_are_never_split) {
  // "é" is C3 A9; "ü" is C3 BC. A stop "ü" must not hold back or cut inside "é".
  stop_string_matcher m(
      {"\xC3\xBC"
       "ber"});
  auto a = m.push("caf\xC3\xA9 ");
  EXPECT_EQ(a.text, "caf\xC3\xA9 ");
  auto b = m.push("\xC3\xBC");
  EXPECT_EQ(b.text, "");
  auto c = m.push("be");
  EXPECT_EQ(c.text, "");
  auto d = m.push("r alles");
  EXPECT_TRUE(d.matched);
  EXPECT_EQ(d.text, "");
  // A stop string that is the tail bytes of a character (not valid UTF-8 on its own) never
  // matches inside that character, and never makes the matcher hold half of one.
  stop_string_matcher tail({"\xA9"});
  auto e = tail.push("caf\xC3\xA9");
  EXPECT_FALSE(e.matched);
  EXPECT_EQ(e.text, "caf\xC3\xA9");
  // Emoji (4 bytes) as the stop string, arriving in one delta, after a CJK character.
  stop_string_matcher emoji({"\xF0\x9F\x98\x80"});
  auto f = feed_all(emoji, {"\xE4\xBD\xA0", "\xF0\x9F\x98\x80", "x"});
  EXPECT_TRUE(f.matched);
  EXPECT_EQ(f.text, "\xE4\xBD\xA0");
}

TEST(stop_string_matcher, empty_stop_string_is_refused_by_name) {
  try {
    stop_string_matcher m({"ok", ""});
    FAIL() << "an empty stop string was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("stop string 1 is empty"), std::string::npos) << e.what();
  }
}

TEST(stop_string_matcher, randomized_any_cut_of_the_text_gives_the_definition) {
  std::mt19937 rng(1234);
  const std::vector<std::string> alphabet = {"a", "b", "c", " ", "\xC3\xA9", "\xE4\xBD\xA0"};
  auto random_text = [&](size_t min_chars, size_t max_chars) {
    std::string s;
    const size_t n = min_chars + rng() % (max_chars - min_chars + 1);
    for (size_t i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops;
    const size_t num_stops = 1 + rng() % 3;
    for (size_t i = 0; i < num_stops; ++i) stops.push_back(random_text(1, 4));
    const std::string text = random_text(0, 40);
    bool expect_match = false;
    const std::string expected = expected_output(text, stops, expect_match);
    // Cut only between characters, as the incremental detokenizer does.
    std::vector<std::string> deltas;
    std::string current;
    for (size_t pos = 0; pos < text.size();) {
      size_t len = 1;
      while (pos + len < text.size() && (static_cast<unsigned char>(text[pos + len]) & 0xC0u) == 0x80u) ++len;
      current += text.substr(pos, len);
      pos += len;
      if (rng() % 3 == 0) deltas.push_back(std::exchange(current, {}));
    }
    deltas.push_back(current);
    stop_string_matcher m(stops);
    std::string emitted;
    bool matched = false;
    for (const auto& d : deltas) {
      auto step = m.push(d);
      emitted += step.text;
      // Whatever has left the matcher is part of the final answer.
      ASSERT_EQ(expected.compare(0, emitted.size(), emitted), 0)
          << "trial " << trial << ": emitted '" << emitted << "', expected '" << expected << "'";
      matched = matched || step.matched;
    }
    emitted += m.finish();
    EXPECT_EQ(matched, expect_match) << "trial " << trial << " text '" << text << "'";
    ASSERT_EQ(emitted, expected) << "trial " << trial << " text '" << text << "'";
  }
}

}  // namespace
}  // namespace troupe
