#pragma once
// The CUDA backend's ops, callable from plain C++: each launcher enqueues one kernel on `stream`
// and checks the launch. Element type `type` is f32, f16 or bf16 (the activation dtype); all
// arithmetic is done in f32. Pointers are device pointers. One op per .cuh/.cu pair.

#include <cuda_runtime.h>

#include <cstdint>

#include "model/dtype.hpp"

namespace troupe::cuda {

// out[i] = in[i] converted, for n values. `from` may be f32, f16, bf16 or q8_0 (n a multiple of
// 32); `to` is f32, f16 or bf16.
void convert(const void* in, dtype from, void* out, dtype to, int64_t n, cudaStream_t stream);

// Gathers rows: out[i, :] = table[ids[i], :].
// table [num_table_rows, cols], ids [n] int32, out [n, cols]
void embedding(const void* table, const int32_t* ids, void* out, int n, int cols, dtype type, cudaStream_t stream);

// With `residual`: residual = x + residual, then out = rms_norm(residual) * weight.
// Without: out = rms_norm(x) * weight.
// x, residual, out [rows, cols]; weight [cols]
void rms_norm(const void* x, void* residual, const void* weight, void* out, int rows, int cols, float eps, dtype type,
              cudaStream_t stream);

// Rotary embedding in the HF rotate-half layout, in place on the q and k heads of each row of
// `qkv` (row = q heads, then k heads, each head_dim wide; row_stride elements apart). With
// q_norm/k_norm (Qwen3), each head is first RMS-normalized with its weight [head_dim].
// positions [num_tokens]; inv_freq [head_dim / 2] (llama3 scaling already applied)
void rope(void* qkv, int64_t row_stride, const int32_t* positions, const float* inv_freq, const void* q_norm,
          const void* k_norm, float eps, int num_tokens, int num_heads, int num_kv_heads, int head_dim, dtype type,
          cudaStream_t stream);

// out = silu(gate) * up where gate_up rows are [gate (inter) | up (inter)].
// gate_up [rows, 2 * inter], out [rows, inter]
void silu_and_mul(const void* gate_up, void* out, int rows, int inter, dtype type, cudaStream_t stream);

// Writes each token's K and V heads to its slot of the paged pools (slot < 0: padding, skipped),
// converted from the activation type `type` to the pool's `kv_type` (f32, f16, bf16, q8_0 with
// head_dim % 32 == 0, fp8_e4m3; backends/cuda/kv_types.cuh).
// k, v rows [num_tokens, num_kv_heads * head_dim], row_stride elements apart;
// k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]; slot_mapping [num_tokens]
void kv_cache_store(const void* k, const void* v, int64_t row_stride, const int64_t* slot_mapping, void* k_cache,
                    void* v_cache, int num_tokens, int num_kv_heads, int head_dim, dtype type, dtype kv_type,
                    cudaStream_t stream);

// Quantized weights (every GGUF block type, and FP8 E4M3 (rows of whole 32s) and its b128
// blocks: model/dtype.hpp; rows row_bytes(type, cols) apart, the matrix 16-byte aligned) are
// read as they are stored, never converted whole.
//
// y [tokens, ldy] (+ bias [rows] of out_type) = x [tokens, ldx] · (diag(row_scales) W)ᵀ for W
// [rows, cols] of weight_type (row_scales [rows] f32, or null for none); x of in_type (f32, f16,
// bf16), 16-byte aligned with ldx a multiple of 8; y of out_type (f32, f16, bf16). Sized for
// decode: each block is read once per 8 tokens (backends/cuda/quant_gemv.cuh).
void quant_gemv(const void* weight, dtype weight_type, const float* row_scales, int rows, int cols, const void* x,
                int64_t ldx, dtype in_type, int tokens, const void* bias, void* y, int64_t ldy, dtype out_type,
                cudaStream_t stream);

// out[i, :] (rows ldo apart) = row ids[i] of the quantized `table` (ids null: row first_row + i),
// times its row scale, in out_type. table [*, cols] of table_type; row_scales [*] f32 or null;
// ids [n]; out [n, ldo], 16-byte aligned, ldo a multiple of 8. The embedding lookup of a
// quantized token table, and the prefill path's slices.
void dequantize_rows(const void* table, dtype table_type, const float* row_scales, int cols, const int32_t* ids,
                     int64_t first_row, int n, void* out, int64_t ldo, dtype out_type, cudaStream_t stream);

// Greedy sampling: out[r] = the first index of the largest value of logits row r.
// logits [rows, vocab] f32, out [rows]
void argmax(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t stream);

// Per-row sampling parameters for `sample` (device memory, one per row).
struct sampling_row {
  float temperature = 1.0f;  // <= 0: greedy
  int top_k = 0;             // <= 0 or >= vocab: off
  float top_p = 1.0f;        // >= 1: off
  uint64_t seed = 0;         // with `offset`, the only source of randomness: same seed, same token
  uint64_t offset = 0;       // usually the sequence's step, so every step draws a new number
  int32_t mask_row = -1;     // this row's token mask: row mask_row of `masks`; < 0: every token allowed
};

// Samples one token per row from softmax(logits / temperature) restricted to the top_k largest
// and then to the smallest top set whose mass reaches top_p.
// logits [rows, vocab] f32, params [rows], out [rows]
void sample(const float* logits, int rows, int vocab, const sampling_row* params, int32_t* out, cudaStream_t stream);
// The same, with token masks (structured output): a token whose bit is clear in its row's mask
// (masks [num_masks, mask_words], bit t of word t / 64; tokens past mask_words * 64 refused)
// counts as logit -inf, in argmax and in the draw alike. A masked row that allows no token
// (or only NaN logits) gets -1, never a refused token.
void sample(const float* logits, int rows, int vocab, const sampling_row* params, const uint64_t* masks, int mask_words,
            int32_t* out, cudaStream_t stream);

// The uniform number in [0, 1) that `sample` draws for (seed, offset): exposed so that tests can
// reproduce a draw on the host.
double sampling_uniform(uint64_t seed, uint64_t offset);

}  // namespace troupe::cuda
