#pragma once
// A regular expression compiled into a deterministic automaton over UTF-8 bytes: Thompson NFA
// (code point classes become UTF-8 byte-range sequences) -> subset construction. Bytes are
// grouped into classes that no transition tells apart, so a state's row has num_classes entries.
//
// States from which no accepting state can be reached are removed (their transitions read
// dead): any prefix the automaton accepts can still be completed, which is what lets a token
// mask never lead the sampler into a corner.

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "grammar/regex.hpp"

namespace troupe {

class byte_dfa {
 public:
  static constexpr int32_t dead = -1;
  // The most states a grammar may need; a pattern that needs more gets a grammar_error.
  static constexpr int default_max_states = 100000;

  // Throws grammar_error when the automaton needs more than max_states states or accepts nothing.
  static byte_dfa compile(const regex_tree& tree, int max_states = default_max_states);
  static byte_dfa compile(std::string_view pattern, int max_states = default_max_states);

  int32_t start() const { return 0; }
  int32_t num_states() const { return static_cast<int32_t>(accepting_.size()); }
  int32_t next(int32_t state, uint8_t byte) const {
    return next_[static_cast<size_t>(state) * num_classes_ + byte_class_[byte]];
  }
  bool accepting(int32_t state) const { return accepting_[static_cast<size_t>(state)] != 0; }
  // The fewest bytes that lead from `state` to an accepting state.
  int32_t distance(int32_t state) const { return distance_[static_cast<size_t>(state)]; }
  // Whether `state` has any transition (an accepting state without one must end).
  bool has_transitions(int32_t state) const;

  // The state after `bytes` from `state`, or dead.
  int32_t walk(int32_t state, std::string_view bytes) const;
  bool matches(std::string_view bytes) const {
    const int32_t end = walk(start(), bytes);
    return end != dead && accepting(end);
  }

 private:
  int num_classes_ = 0;
  std::array<uint8_t, 256> byte_class_{};
  std::vector<int32_t> next_;       // [num_states, num_classes] next state or dead
  std::vector<uint8_t> accepting_;  // [num_states]
  std::vector<int32_t> distance_;   // [num_states] bytes to acceptance
};

}  // namespace troupe
