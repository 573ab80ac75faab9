#pragma once
// Which detokenizer holds a request's text. A request's deltas must always reach the same
// detokenizer (it keeps the request's incremental decoder and stop-string state), so requests are
// sharded by id; the router splits each instance's token batch accordingly.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stages/messages.hpp"

namespace troupe {

// The index, in [0, num_detokenizers), of the detokenizer that owns `request_id`. The id is mixed
// first (splitmix64's finalizer): its low bits name the door the request came through
// (doors/request_admission.hpp), so a plain modulo sent every request of one door to the same
// half of the detokenizers.
inline size_t detokenizer_of(int64_t request_id, size_t num_detokenizers) {
  uint64_t x = static_cast<uint64_t>(request_id);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<size_t>(x % num_detokenizers);
}

// `batch` cut into one batch per detokenizer ([num_detokenizers]; some may be empty), each delta
// with its timeline and each failure in its owner's part, in their original order. No
// detokenizer: no parts.
std::vector<token_batch> split_for_detokenizers(token_batch batch, size_t num_detokenizers);

}  // namespace troupe
