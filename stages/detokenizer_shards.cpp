#include "stages/detokenizer_shards.hpp"

namespace troupe {

std::vector<token_batch> split_for_detokenizers(token_batch batch, size_t num_detokenizers) {
  std::vector<token_batch> parts(num_detokenizers);
  if (num_detokenizers == 0) return parts;
  if (num_detokenizers == 1) {
    parts.front() = std::move(batch);
    return parts;
  }
  for (size_t i = 0; i < batch.deltas.size(); ++i) {
    token_batch& part = parts[detokenizer_of(batch.deltas[i].request_id, num_detokenizers)];
    part.deltas.push_back(std::move(batch.deltas[i]));
    part.timelines.push_back(std::move(batch.timelines[i]));
  }
  for (request_failed& failure : batch.failures) {
    parts[detokenizer_of(failure.request_id, num_detokenizers)].failures.push_back(std::move(failure));
  }
  return parts;
}

}  // namespace troupe
