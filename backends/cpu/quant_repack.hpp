#pragma once
// Quantized weights repacked at load into the layout the integer kernels multiply, so decode
// stops paying for block decoding at every step (llama.cpp's CPU "repack" buffers do the same).
//
// The kernels (quant_kernels_impl.hpp) multiply tiles of R weight rows whose codes are
// interleaved [4 elements][R rows] and whose scales are one lane per row; from the GGUF layout
// they build that tile again at every call, which costs more than reading the bytes on this
// machine (docs/benchmarks.md, "Quantized weights"). A repacked matrix keeps the weights
// quantized (4 bits stay 4 bits) but stores each tile already interleaved, with the packed
// 6-bit sub-block scales unpacked to bytes:
//
// Q4_K, tile of R rows (row r0 + r is lane r; lanes past the matrix are zero), super-block b of
// 256 elements at tile + b * q4_k_repacked_block_bytes(R):
//   codes  uint8 [32][R][4]   pair p, lane r, byte i: code of element 8p + i in its low nibble,
//                             of element 8p + 4 + i in its high nibble (codes 0..15)
//   d      float [R]          the block's d (f16 read exactly)
//   neg_dmin float [R]        -dmin, so -(dmin * m) is one multiply, rounded as the reference
//   sc     int8  [8][R]       the 6-bit scale of each 32-element sub-block
//   m      int8  [8][R]       the 6-bit min of each sub-block
// 152 bytes per row and super-block against GGUF's 144 (+5.6 %).
//
// Q6_K, the same tiles (codes are the 6-bit q, 0..63, standing for q - 32):
//   low    uint8 [32][R][4]   the low 4 bits of each code, nibble pairs as Q4_K's codes
//   high   uint8 [16][R][4]   sub-block s (16 elements), lane r, byte i: the top 2 bits of
//                             element 16s + 4t + i in bits 2t, 2t + 1 (t = 0..3)
//   d      float [R]
//   sc     int8  [16][R]      each 16-element sub-block's scale
// 212 bytes per row and super-block against GGUF's 210 (+1 %). The kernels compute D = d * sc
// and M = neg_dmin * m exactly as the decoder does, so a repacked product has the same bits as
// the GGUF one (the canonical sum of quant_kernels_impl.hpp): batch invariance is untouched.
//
// Q5_K, Q4_K's tiles plus the fifth bit of each code (codes 0..31):
//   low    uint8 [32][R][4]   the low 4 bits of each code, nibble pairs as Q4_K's codes
//   high   uint8 [8][R][4]    sub-block s (32 elements), lane r, byte i: the fifth bit of element
//                             32s + 8p + i in bit 2p, of element 32s + 8p + 4 + i in bit 2p + 1
//   d, neg_dmin, sc, m        as Q4_K's
// 184 bytes per row and super-block against GGUF's 176 (+4.5 %).
//
// IQ4_XS, the same tiles holding the 4-bit indices into the non-linear levels (the kernels look
// the levels up in a register, as the GGUF kernel's decoder does in memory):
//   codes  uint8 [32][R][4]   index pairs as Q4_K's codes
//   d      float [R]
//   sc     int8  [8][R]       each 32-element sub-block's scale (-32..31)
// 140 bytes per row and super-block against GGUF's 136 (+2.9 %).
//
// The legacy types are repacked by their own 32-element blocks (so any k that is whole blocks),
// block b of a tile at tile + b * <type>_repacked_block_bytes(R); d stays f16 (the kernels
// widen it exactly, as the decoder does), so both keep GGUF's size:
// Q4_0:
//   codes  uint8 [4][R][4]    nibble pairs as Q4_K's (the raw nibbles, code + 8: 0..15)
//   d      f16   [R]
// 18 bytes per row and block, as in GGUF.
// Q8_0:
//   codes  int8  [8][R][4]    group g, lane r, byte i: the signed code of element 4g + i
//   d      f16   [R]
// 34 bytes per row and block, as in GGUF.
//
// The repacked copy is owned memory; the GGUF bytes it came from are no longer read by the CPU
// model (the loader's mapping stays, its pages can be dropped: release_source_pages).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/dtype.hpp"

namespace troupe::cpu {

struct weight_view;
class thread_pool;

// `static`: the per-ISA kernel files include this (see STYLE of row_kernels_impl.hpp).
static constexpr size_t q4_k_repacked_block_bytes(int R) { return static_cast<size_t>(R) * (128 + 8 + 16); }

static constexpr size_t q6_k_repacked_block_bytes(int R) { return static_cast<size_t>(R) * (128 + 64 + 4 + 16); }

static constexpr size_t q5_k_repacked_block_bytes(int R) { return static_cast<size_t>(R) * (128 + 32 + 8 + 16); }

static constexpr size_t iq4_xs_repacked_block_bytes(int R) { return static_cast<size_t>(R) * (128 + 4 + 8); }

static constexpr size_t q4_0_repacked_block_bytes(int R) { return static_cast<size_t>(R) * (16 + 2); }

static constexpr size_t q8_0_repacked_block_bytes(int R) { return static_cast<size_t>(R) * (32 + 2); }

// Bytes of one block of `type` (its dtype_block_size elements) over a tile of R rows; 0 for the
// types without a repacked layout.
static constexpr size_t repacked_block_bytes(dtype type, int R) {
  switch (type) {
    case dtype::q4_k: return q4_k_repacked_block_bytes(R);
    case dtype::q5_k: return q5_k_repacked_block_bytes(R);
    case dtype::q6_k: return q6_k_repacked_block_bytes(R);
    case dtype::iq4_xs: return iq4_xs_repacked_block_bytes(R);
    case dtype::q4_0: return q4_0_repacked_block_bytes(R);
    case dtype::q8_0: return q8_0_repacked_block_bytes(R);
    default: return 0;
  }
}

// Bytes of one tile of R rows of a repacked [*, k] matrix of `type`.
size_t repacked_tile_bytes(dtype type, int64_t k, int R);

// Whether `type` has a repacked layout (Q4_K and Q6_K, the types of a Q4_K_M file; Q5_K, IQ4_XS,
// Q4_0, Q8_0).
bool has_repacked_layout(dtype type);

struct aligned_free {
  void operator()(std::byte* p) const;
};
using repacked_buffer = std::unique_ptr<std::byte[], aligned_free>;

// Bytes of w repacked in tiles of R rows (a multiple of 64, so matrices can share one buffer).
size_t repacked_bytes(const weight_view& w, int R);

// A 64-byte aligned buffer of `bytes` for repacked weights. Above 2 MiB it is 2 MiB aligned and
// asks for transparent huge pages (MADV_HUGEPAGE, where the kernel's THP mode is "madvise"): on
// the 1.1 B Q8_0 file that halved the load (a fault per 2 MiB instead of per 4 KiB) and made
// decode 1.5x faster (TLB misses), measured side by side (docs/benchmarks.md).
repacked_buffer allocate_repacked(size_t bytes);

// Repacks w (rows tiles of R, the last padded with zero lanes) into out (repacked_bytes(w, R)) on
// the pool's threads; repack_weights allocates the buffer too. Throw std::runtime_error when w's
// type has no repacked layout or k is not whole blocks of it.
void repack_weights_into(thread_pool& pool, const weight_view& w, int R, std::byte* out);
repacked_buffer repack_weights(thread_pool& pool, const weight_view& w, int R);

// Whether models repack at load (default on; benchmarks turn it off to measure the difference).
bool weight_repacking();
void set_weight_repacking(bool on);

// Whether w would be repacked for the active level's kernels: the switch is on, the integer
// kernels are on, the level and type have a repacked layout, w is plain with k whole blocks.
bool repacks_at_active_level(const weight_view& w);

// Repacks every matrix of `weights` that repacks_at_active_level into one buffer (so huge pages
// are not wasted on each matrix's last one), points their `repacked` at it and returns it (null
// when none was repacked). `done` is called with each matrix as soon as it is repacked (a model
// drops its source pages there, so the peak holds one matrix twice, not the whole model).
repacked_buffer repack_for_active_level(thread_pool& pool, const std::vector<weight_view*>& weights,
                                        const std::function<void(const weight_view&)>& done = {});

// Drops this process's resident pages of w's bytes (madvise DONTNEED on the whole pages inside
// them) when they belong to a read-only file mapping (a GGUF or safetensors file): after
// repacking, the CPU never reads them again, and a dropped page is read back from the file if
// anything does. Weights in anonymous memory (converted or owned buffers) are left alone, as
// dropping those would zero them. Returns the bytes released.
size_t release_source_pages(const weight_view& w);

// Whether p lies in a read-only mapping of a file (an inode in /proc/self/maps): a model file's
// bytes, which the kernel can read again, as opposed to anonymous memory.
bool in_file_mapping(const void* p);

}  // namespace troupe::cpu
