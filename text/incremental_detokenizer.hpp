#pragma once
// Streaming detokenization for the detokenizer stage: ids come in one by one and each push returns
// the text that became final. It never returns a broken UTF-8 sequence, and the concatenation of
// all push() results and finish() equals tokenizer::decode of all the ids.

#include <cstdint>
#include <memory>
#include <string>

#include "text/token_decoder.hpp"

namespace troupe {

class tokenizer;
namespace detail {
struct tokenizer_impl;
}

class incremental_detokenizer {
 public:
  // continuation: the ids continue a prompt (a served request's output): the first token keeps
  // its leading space and the text is the tokens' bytes exactly (token_decoder::start).
  incremental_detokenizer(const tokenizer& tok, bool skip_special_tokens = true, bool continuation = false);

  std::string push(std::int32_t id);  // new complete text since the last call
  std::string finish();               // what is left (U+FFFD for a dangling broken sequence)

 private:
  std::shared_ptr<const detail::tokenizer_impl> impl_;
  bool skip_special_tokens_;
  bool continuation_;
  token_decoder::state state_;
};

}  // namespace troupe
