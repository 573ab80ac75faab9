#pragma once
// Stop strings over streamed text: fed one request's text deltas as they are produced, it passes
// on the text that can no longer be part of a stop string and holds back only the tail that could
// still grow into one, so a prefix of a stop string is never emitted and then found to complete.
//
// The match is the stop string that completes first in the text stream (on a tie, the longest,
// i.e. the one that starts first); the text ends just before it. Which match is found does not
// depend on how the text was cut into deltas. Matches start only on UTF-8 character boundaries,
// and the held-back tail always begins on one, so a multi-byte character is never split (the
// incremental detokenizer already hands over whole characters).

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

class stop_string_matcher {
 public:
  struct step {
    std::string text;      // safe to emit now
    bool matched = false;  // a stop string completed: `text` ends just before it, the request is done
  };

  // Throws std::invalid_argument for an empty stop string (it would match before any text).
  explicit stop_string_matcher(std::vector<std::string> stop_strings = {});

  // The next piece of text. After a match every call returns nothing.
  step push(std::string_view text);
  // The request ended otherwise (length, EOS, abort): the held-back tail is released. Nothing
  // after a match.
  std::string finish();

  bool active() const { return !stop_strings_.empty(); }
  bool matched() const { return matched_index_ >= 0; }
  // Which of the stop strings matched, or -1.
  int matched_index() const { return matched_index_; }
  size_t num_held_bytes() const { return held_.size(); }

 private:
  // Where the first-completing match in held_ starts, or npos; sets matched_index_.
  size_t find_first_match();
  // Where the longest suffix of held_ that is a proper prefix of a stop string starts.
  size_t start_of_possible_stop() const;

  std::vector<std::string> stop_strings_;
  size_t max_stop_bytes_ = 0;
  std::string held_;  // text not emitted yet: always a possible start of a stop string (when idle)
  int matched_index_ = -1;
};

}  // namespace troupe
