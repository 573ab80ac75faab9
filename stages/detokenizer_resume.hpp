#pragma once
// A detokenizer placed in place of a lost one takes over the lost one's requests mid-stream. The
// router sends it, per request whose client already has some text, the token ids the client's
// text was spelled from: the new detokenizer runs them through its incremental decoder and
// stop-string matcher without sending anything, so it holds exactly the state the lost one held
// (bytes of an unfinished character, a tail that may start a stop string), and the tokens that
// follow are spelled as the lost one would have spelled them: none lost, none repeated.

#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

struct detokenizer_resume_msg {
  int64_t request_id = 0;
  std::vector<std::string> stop;     // the request's stop strings (its first delta carried them)
  bool skip_special_tokens = true;   // likewise
  std::vector<int32_t> spelled_ids;  // the output tokens whose text the client already has
};

}  // namespace troupe
