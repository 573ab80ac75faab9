#pragma once
// Nano-batches: a step's batch cut into a few contiguous pieces that a device runs side by side
// (on separate CUDA streams), so that one piece's compute-bound matrix products overlap another's
// memory-bound attention, as NanoFlow does. The cut only falls between sequences, so every op of a
// piece works on a contiguous range of the batch's rows and attention never spans two pieces.
//
// This is the host-side plan; backends/cuda/cuda_model.cpp runs it. Backend-independent so that
// the CPU-only build tests it.

#include <cstdint>
#include <vector>

namespace troupe {

struct nano_batch {
  int first_seq = 0, end_seq = 0;  // sequences [first_seq, end_seq) of the batch
  int first_row = 0, end_row = 0;  // their rows (new tokens) [first_row, end_row)
  int num_rows() const { return end_row - first_row; }
};

// Cuts the batch described by `query_start` [num_seqs + 1] into at most `max_pieces` pieces of
// about equal rows, each at least `min_rows` long; a batch too small to cut, or a single long
// sequence, stays one piece. Every sequence lands in exactly one piece, in order; an empty batch
// gives no pieces.
std::vector<nano_batch> plan_nano_batches(const std::vector<int32_t>& query_start, int max_pieces, int min_rows);

}  // namespace troupe
