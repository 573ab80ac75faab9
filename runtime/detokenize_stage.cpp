#include "runtime/detokenize_stage.hpp"

namespace troupe {

text_batch detokenize_stage::run(token_batch batch) {
  text_batch out;
  out.deltas.reserve(batch.deltas.size());
  for (size_t i = 0; i < batch.deltas.size(); ++i) {
    auto& delta = batch.deltas[i];
    text_delta text;
    auto it = live_.find(delta.request_id);
    if (it == live_.end()) {
      it = live_.emplace(delta.request_id, incremental_detokenizer(tokenizer_, /*skip_special_tokens=*/true)).first;
    }
    // A stop token ends the text; it is reported among the ids but not spelled out.
    size_t num_spelled = delta.token_ids.size();
    if (delta.finish == finish_reason::stop && num_spelled > 0) --num_spelled;
    for (size_t k = 0; k < num_spelled; ++k) text.text += it->second.push(delta.token_ids[k]);
    if (delta.finished()) {
      text.text += it->second.finish();
      live_.erase(it);
      if (i < batch.timelines.size()) text.timeline = batch.timelines[i];
    }
    text.delta = std::move(delta);
    out.deltas.push_back(std::move(text));
  }
  return out;
}

}  // namespace troupe
