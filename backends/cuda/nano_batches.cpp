#include "backends/cuda/nano_batches.hpp"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace troupe {

std::vector<nano_batch> plan_nano_batches(const std::vector<int32_t>& query_start, int max_pieces, int min_rows) {
  if (query_start.empty() || query_start.front() != 0) {
    throw std::runtime_error("nano batches: query_start must begin with 0");
  }
  if (max_pieces < 1)
    throw std::runtime_error("nano batches: max_pieces must be >= 1, got " + std::to_string(max_pieces));
  const int num_seqs = static_cast<int>(query_start.size()) - 1;
  const int rows = query_start.back();
  const int pieces = std::clamp(std::min(max_pieces, num_seqs), 1, std::max(1, rows / std::max(1, min_rows)));
  std::vector<nano_batch> out;
  int seq = 0;
  for (int p = 0; p < pieces && seq < num_seqs; ++p) {
    nano_batch piece;
    piece.first_seq = seq;
    piece.first_row = query_start[seq];
    if (p == pieces - 1) {
      seq = num_seqs;
    } else {
      // End at the sequence boundary closest to an even share of the rows still to place, keeping
      // at least one sequence here and one for each piece after it.
      const int target = piece.first_row + (rows - piece.first_row) / (pieces - p);
      int end = seq + 1;
      while (end < num_seqs - (pieces - p - 1) &&
             std::abs(query_start[end + 1] - target) <= std::abs(query_start[end] - target)) {
        ++end;
      }
      seq = end;
    }
    piece.end_seq = seq;
    piece.end_row = query_start[seq];
    out.push_back(piece);
  }
  // A piece shorter than min_rows (a long sequence took most rows) joins its neighbour.
  for (size_t i = 0; out.size() > 1 && i < out.size();) {
    if (out[i].num_rows() >= min_rows) {
      ++i;
      continue;
    }
    const size_t into = i == 0 ? 1 : i - 1;
    nano_batch& keep = out[into];
    keep.first_seq = std::min(keep.first_seq, out[i].first_seq);
    keep.first_row = std::min(keep.first_row, out[i].first_row);
    keep.end_seq = std::max(keep.end_seq, out[i].end_seq);
    keep.end_row = std::max(keep.end_row, out[i].end_row);
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(i));
    i = 0;
  }
  return out;
}

}  // namespace troupe
