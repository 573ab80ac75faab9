#include "text/incremental_detokenizer.hpp"

#include "text/tokenizer.hpp"
#include "text/tokenizer_impl.hpp"

namespace troupe {

incremental_detokenizer::incremental_detokenizer(const tokenizer& tok, bool skip_special_tokens, bool continuation)
    : impl_(tok.impl_),
      skip_special_tokens_(skip_special_tokens),
      continuation_(continuation),
      state_(impl_->decoder.start(continuation)) {}

std::string incremental_detokenizer::push(std::int32_t id) {
  std::string out;
  if (id < 0 || id >= static_cast<std::int32_t>(impl_->entries.size())) return out;
  const auto& entry = impl_->entries[id];
  if (entry.text == nullptr || (skip_special_tokens_ && entry.special)) return out;
  impl_->decoder.push(state_, *entry.text, entry.added, out);
  return out;
}

std::string incremental_detokenizer::finish() {
  std::string out;
  impl_->decoder.finish(state_, out);
  state_ = impl_->decoder.start(continuation_);
  return out;
}

}  // namespace troupe
