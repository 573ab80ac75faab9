#include "model/loader/rope_permutation.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe {
namespace {

// Calls move(hf_row, gguf_row) for every row: within each head, HF row (half h, index j) is GGUF
// row 2*j + h. Both directions are this one mapping, read one way or the other.
template <class Move>
void for_each_row_pair(int64_t num_rows, int num_heads, Move move) {
  if (num_heads <= 0 || num_rows % num_heads != 0 || (num_rows / num_heads) % 2 != 0) {
    throw std::runtime_error("cannot permute " + std::to_string(num_rows) + " rows into " + std::to_string(num_heads) +
                             " heads of even size");
  }
  const int64_t head_dim = num_rows / num_heads;
  const int64_t half = head_dim / 2;
  for (int64_t head = 0; head < num_heads; ++head) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t j = 0; j < half; ++j) move(head * head_dim + h * half + j, head * head_dim + 2 * j + h);
    }
  }
}

}  // namespace

void permute_rows_hf_to_gguf(const std::byte* src, std::byte* dst, int64_t num_rows, size_t row_bytes, int num_heads) {
  for_each_row_pair(num_rows, num_heads, [&](int64_t hf_row, int64_t gguf_row) {
    std::memcpy(dst + gguf_row * row_bytes, src + hf_row * row_bytes, row_bytes);
  });
}

void permute_rows_gguf_to_hf(const std::byte* src, std::byte* dst, int64_t num_rows, size_t row_bytes, int num_heads) {
  for_each_row_pair(num_rows, num_heads, [&](int64_t hf_row, int64_t gguf_row) {
    std::memcpy(dst + hf_row * row_bytes, src + gguf_row * row_bytes, row_bytes);
  });
}

}  // namespace troupe
