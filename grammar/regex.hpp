#pragma once
// The regular expressions constraints are written in, parsed into a small tree over Unicode code
// points (the byte-level automaton encodes them as UTF-8, see byte_dfa.hpp).
//
// The dialect is the common subset of ECMAScript and PCRE that JSON schema patterns use: literals,
// `.` (any character but \n), classes `[a-z]` `[^"]` with \d \w \s \D \W \S and escapes inside,
// groups `( )` and `(?: )`, `|`, the quantifiers `* + ? {n} {n,} {n,m}` (greedy; a trailing `?`
// for laziness is accepted and means nothing here: the whole output must match), `^` at the
// start and `$` at the end, escapes \n \r \t \f \v \0 \xHH \uHHHH \x{H..}. Not supported, with an
// error naming them: backreferences, lookaround, named groups, word boundaries, anchors inside.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe {

using codepoint_range = std::pair<uint32_t, uint32_t>;  // inclusive

struct regex_node {
  enum class type { empty, char_class, concat, alternation, repeat };
  type kind = type::empty;
  std::vector<codepoint_range> ranges;  // char_class: sorted, disjoint, surrogates excluded
  std::vector<int> children;            // concat, alternation: the parts; repeat: one
  int min = 0;                          // repeat
  int max = -1;                         // repeat: -1 unbounded
};

// A tree stored flat: nodes refer to their children by index.
struct regex_tree {
  std::vector<regex_node> nodes;
  int root = -1;

  int add(regex_node node) {
    nodes.push_back(std::move(node));
    return static_cast<int>(nodes.size()) - 1;
  }
};

// Throws grammar_error naming the position and the unsupported or malformed part.
regex_tree parse_regex(std::string_view pattern);

// A regex of the same dialect that matches what `tree` matches (classes written with \x{..}).
std::string print_regex(const regex_tree& tree);

// Character class helpers (sorted, disjoint ranges; surrogates never included).
std::vector<codepoint_range> normalize_ranges(std::vector<codepoint_range> ranges);
std::vector<codepoint_range> complement_ranges(const std::vector<codepoint_range>& ranges);
std::vector<codepoint_range> intersect_ranges(const std::vector<codepoint_range>& a,
                                              const std::vector<codepoint_range>& b);

// `text` with every character that means something in a regex escaped.
std::string regex_escape(std::string_view text);

}  // namespace troupe
