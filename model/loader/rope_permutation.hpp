#pragma once
// llama.cpp's GGUF files of architecture "llama" store q/k projection rows in the original Meta
// layout, where RoPE rotates interleaved pairs (0,1), (2,3)...; HF stores them so RoPE rotates
// halves (i, i + head_dim/2). Within each head, HF row (half h, index j) is GGUF row 2*j + h.
// Rows are moved whole, so this works for any element type, Q8_0 included, and for biases
// (a bias is a column of 1-element rows).

#include <cstddef>
#include <cstdint>

namespace troupe {

// HF rotate-half layout -> GGUF interleaved layout. `num_rows` = num_heads * head_dim.
void permute_rows_hf_to_gguf(const std::byte* src, std::byte* dst, int64_t num_rows, size_t row_bytes, int num_heads);
// GGUF interleaved layout -> HF rotate-half layout.
void permute_rows_gguf_to_hf(const std::byte* src, std::byte* dst, int64_t num_rows, size_t row_bytes, int num_heads);

}  // namespace troupe
