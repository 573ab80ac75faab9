#include "backends/cpu/quant_repack.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "backends/cpu/matmul.hpp"
#include "backends/cpu/quant_kernels.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "model/quant/block_fields.hpp"

namespace troupe::cpu {
namespace {

// One source block unpacked to plain arrays before it is interleaved: codes as the repacked
// layout stores them (unsigned nibbles or 6-bit q, or Q8_0's signed bytes), element by element.
// Decoding a whole block at a time keeps the loops free of per-element index arithmetic (load
// time is this loop's: docs/benchmarks.md).
struct unpacked_block {
  uint8_t codes[256];  // [elements of the block]
};

// Q4_K (144 bytes: d, dmin, 12 bytes of packed scales and mins, 128 bytes of nibbles): each 64
// elements are 32 bytes of qs, low nibbles the first 32.
void unpack_q4_k(const uint8_t* qs, unpacked_block& u) {
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      u.codes[64 * g + l] = qs[32 * g + l] & 0x0f;
      u.codes[64 * g + 32 + l] = qs[32 * g + l] >> 4;
    }
  }
}

// Q5_K (176 bytes: Q4_K's d, dmin and scales, 32 bytes of qh, 128 of nibbles): element 64 i + l
// (l < 32) is the low nibble of qs[32 i + l] with bit 2i of qh[l] on top, element 64 i + 32 + l
// its high nibble with bit 2i + 1.
void unpack_q5_k(const uint8_t* qh, const uint8_t* qs, unpacked_block& u) {
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      u.codes[64 * g + l] = static_cast<uint8_t>((qs[32 * g + l] & 0x0f) | (((qh[l] >> (2 * g)) & 1) << 4));
      u.codes[64 * g + 32 + l] = static_cast<uint8_t>((qs[32 * g + l] >> 4) | (((qh[l] >> (2 * g + 1)) & 1) << 4));
    }
  }
}

// Q6_K (ql 128, qh 64, sc 16, d): element 128 h + 32 t + l (l < 32) has its low bits in
// ql[64 h + 32 (t & 1) + l] (nibble t >> 1) and its top bits in bits 2t, 2t + 1 of qh[32 h + l].
void unpack_q6_k(const uint8_t* ql, const uint8_t* qh, unpacked_block& u) {
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 4; ++t) {
      const uint8_t* low = ql + 64 * h + 32 * (t & 1);
      const int shift = 4 * (t >> 1);
      for (int l = 0; l < 32; ++l) {
        u.codes[128 * h + 32 * t + l] =
            static_cast<uint8_t>(((low[l] >> shift) & 0x0f) | (((qh[32 * h + l] >> (2 * t)) & 3) << 4));
      }
    }
  }
}

// Pairs of codes of 4-bit layouts into lane r: byte i of pair p holds element 8p + i in its low
// nibble, 8p + 4 + i in its high one (`count` elements, a multiple of 8).
void store_nibble_pairs(const uint8_t* codes, int count, int R, int r, uint8_t* out) {
  for (int p = 0; p < count / 8; ++p) {
    uint8_t* dst = out + (p * R + r) * 4;
    for (int i = 0; i < 4; ++i)
      dst[i] = static_cast<uint8_t>((codes[8 * p + i] & 0x0f) | ((codes[8 * p + 4 + i] & 0x0f) << 4));
  }
}

// The scale header Q4_K and Q5_K share, after their codes: lane r of
//   d         f32  [R]
//   -dmin     f32  [R]
//   scales    int8 [8][R]   the 6-bit sub-block scales, unpacked
//   mins      int8 [8][R]
// read from the GGUF block's f16 d, f16 dmin and 12 packed bytes.
void repack_k_scale_header(const std::byte* block, int R, int r, std::byte* header) {
  float* d = reinterpret_cast<float*>(header);
  float* neg_dmin = d + R;
  int8_t* sc = reinterpret_cast<int8_t*>(neg_dmin + R);
  int8_t* m = sc + 8 * R;
  d[r] = quant::read_f16(block);
  neg_dmin[r] = -quant::read_f16(block + 2);
  const uint8_t* packed = quant::bytes_at(block + 4);
  for (int s = 0; s < 8; ++s) {
    uint8_t scale, min;
    quant::k_scale_min(s, packed, &scale, &min);
    sc[s * R + r] = static_cast<int8_t>(scale);
    m[s * R + r] = static_cast<int8_t>(min);
  }
}

void repack_q4_k_block(const std::byte* block, int R, int r, std::byte* out) {
  uint8_t* codes = reinterpret_cast<uint8_t*>(out);   // [32][R][4]
  repack_k_scale_header(block, R, r, out + 128 * R);  // d, -dmin, scales, mins after the codes
  unpacked_block u;
  unpack_q4_k(quant::bytes_at(block + 16), u);
  store_nibble_pairs(u.codes, 256, R, r, codes);
}

// Q4_K's layout plus the fifth bits: byte i of sub-block s holds those of element 32s + 8p + i
// in bit 2p and of element 32s + 8p + 4 + i in bit 2p + 1, the two codes of pair p's byte i.
void repack_q5_k_block(const std::byte* block, int R, int r, std::byte* out) {
  uint8_t* low = reinterpret_cast<uint8_t*>(out);  // [32][R][4]
  uint8_t* high = low + 128 * R;                   // [8][R][4]
  repack_k_scale_header(block, R, r,
                        reinterpret_cast<std::byte*>(high + 32 * R));  // d, -dmin, scales, mins after the fifth bits
  unpacked_block u;
  unpack_q5_k(quant::bytes_at(block + 16), quant::bytes_at(block + 48), u);
  store_nibble_pairs(u.codes, 256, R, r, low);
  for (int s = 0; s < 8; ++s) {
    uint8_t* dst = high + (s * R + r) * 4;
    for (int i = 0; i < 4; ++i) {
      uint8_t byte = 0;
      for (int p = 0; p < 4; ++p) {
        byte = static_cast<uint8_t>(byte | ((u.codes[32 * s + 8 * p + i] >> 4) << (2 * p)) |
                                    ((u.codes[32 * s + 8 * p + 4 + i] >> 4) << (2 * p + 1)));
      }
      dst[i] = byte;
    }
  }
}

// IQ4_XS (136 bytes: f16 d, 16 bits of high scale bits, 4 bytes of low ones, then 16 bytes of
// indices per 32-element sub-block: element j < 16 the low nibble of byte j, j + 16 its high).
void repack_iq4_xs_block(const std::byte* block, int R, int r, std::byte* out) {
  uint8_t* codes = reinterpret_cast<uint8_t*>(out);    // [32][R][4]
  float* d = reinterpret_cast<float*>(out + 128 * R);  // [R]
  int8_t* sc = reinterpret_cast<int8_t*>(d + R);       // [8][R]
  d[r] = quant::read_f16(block);
  unpacked_block u;
  for (int s = 0; s < 8; ++s) {
    sc[s * R + r] = static_cast<int8_t>(quant::iq4_xs_sub_scale(block, s));
    const uint8_t* qs = quant::bytes_at(block + 8 + 16 * s);
    for (int j = 0; j < 16; ++j) {
      u.codes[32 * s + j] = qs[j] & 0x0f;
      u.codes[32 * s + 16 + j] = qs[j] >> 4;
    }
  }
  store_nibble_pairs(u.codes, 256, R, r, codes);
}

void repack_q6_k_block(const std::byte* block, int R, int r, std::byte* out) {
  uint8_t* low = reinterpret_cast<uint8_t*>(out);      // [32][R][4]
  uint8_t* high = low + 128 * R;                       // [16][R][4]
  float* d = reinterpret_cast<float*>(high + 64 * R);  // [R]
  int8_t* sc = reinterpret_cast<int8_t*>(d + R);       // [16][R]
  d[r] = quant::read_f16(block + 208);
  for (int s = 0; s < 16; ++s) sc[s * R + r] = static_cast<int8_t>(quant::bytes_at(block + 192)[s]);
  unpacked_block u;
  unpack_q6_k(quant::bytes_at(block), quant::bytes_at(block + 128), u);
  store_nibble_pairs(u.codes, 256, R, r, low);
  // Top bits: byte i of sub-block s holds those of element 16s + 4t + i in bits 2t, 2t + 1.
  for (int s = 0; s < 16; ++s) {
    uint8_t* dst = high + (s * R + r) * 4;
    for (int i = 0; i < 4; ++i) {
      uint8_t byte = 0;
      for (int t = 0; t < 4; ++t) byte = static_cast<uint8_t>(byte | ((u.codes[16 * s + 4 * t + i] >> 4) << (2 * t)));
      dst[i] = byte;
    }
  }
}

// Q4_0 (18 bytes: f16 d, 16 bytes of nibbles; element j < 16 the low nibble of qs[j], j + 16
// its high nibble) into lane r of a repacked block.
void repack_q4_0_block(const std::byte* block, int R, int r, std::byte* out) {
  uint8_t* codes = reinterpret_cast<uint8_t*>(out);         // [4][R][4]
  uint16_t* d = reinterpret_cast<uint16_t*>(out + 16 * R);  // [R]
  std::memcpy(&d[r], block, 2);
  const uint8_t* qs = quant::bytes_at(block + 2);
  uint8_t c[32];
  for (int j = 0; j < 16; ++j) {
    c[j] = qs[j] & 0x0f;
    c[j + 16] = qs[j] >> 4;
  }
  store_nibble_pairs(c, 32, R, r, codes);
}

// Q8_0 (34 bytes: f16 d, 32 signed codes) into lane r of a repacked block.
void repack_q8_0_block(const std::byte* block, int R, int r, std::byte* out) {
  uint8_t* codes = reinterpret_cast<uint8_t*>(out);         // [8][R][4]
  uint16_t* d = reinterpret_cast<uint16_t*>(out + 32 * R);  // [R]
  std::memcpy(&d[r], block, 2);
  for (int g = 0; g < 8; ++g) std::memcpy(codes + (g * R + r) * 4, block + 2 + 4 * g, 4);
}

}  // namespace

bool in_file_mapping(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long begin = 0, end = 0, inode = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %*s %*s %lu", &begin, &end, perms, &inode) != 4) continue;
    if (address >= begin && address < end) return inode != 0 && perms[1] != 'w';
  }
  return false;
}

namespace {

std::atomic<bool> repacking{true};

// Maps w's bytes into this process's page tables in one call (MADV_POPULATE_READ) before the
// repack reads them: one fault per 4 KiB page of a mapped file (16 with fault-around) cost the load
// more than the repack itself in a VM. Advice only: where the kernel refuses, the faults happen.
void populate_source_pages(const weight_view& w) {
#ifdef MADV_POPULATE_READ
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(w.data) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(w.data) + row_bytes(w.type, w.cols) * static_cast<size_t>(w.rows);
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);
#else
  (void)w;
#endif
}

using repack_block_fn = void (*)(const std::byte* block, int R, int r, std::byte* out);

// Tiles [begin, end) of w into `out`, each tile's rows one after the other (a row's blocks are
// read in order; the tile being written, k / 32 * 18 R bytes and up, stays in L2). Block is a
// template argument so the per-block function is inlined into these loops.
template <repack_block_fn Block>
void repack_tiles(const weight_view& w, int R, int64_t begin, int64_t end, std::byte* out) {
  const size_t stride = row_bytes(w.type, w.cols);
  const int64_t blocks = w.cols / dtype_block_size(w.type);
  const size_t source_block_bytes = dtype_traits_of(w.type).block_bytes;  // GGUF's: 144 (Q4_K), 18 (Q4_0), ...
  const size_t out_block_bytes = repacked_block_bytes(w.type, R);
  const size_t tile_bytes = static_cast<size_t>(blocks) * out_block_bytes;
  for (int64_t t = begin; t < end; ++t) {
    std::byte* tile = out + t * tile_bytes;
    const int rows = static_cast<int>(std::min<int64_t>(R, w.rows - t * R));
    if (rows < R) std::memset(tile, 0, tile_bytes);  // lanes past the last row: zero codes and scales
    for (int r = 0; r < rows; ++r) {
      const std::byte* row = w.data + (t * R + r) * stride;
      for (int64_t b = 0; b < blocks; ++b) Block(row + b * source_block_bytes, R, r, tile + b * out_block_bytes);
    }
  }
}

}  // namespace

bool weight_repacking() { return repacking.load(std::memory_order_relaxed); }
void set_weight_repacking(bool on) { repacking.store(on, std::memory_order_relaxed); }

bool repacks_at_active_level(const weight_view& w) {
  const quant_kernels& kernels = active_quant_kernels();
  return weight_repacking() && matmul_integer_kernels() && kernels.repack_rows != 0 &&
         kernels.matmul_repacked[static_cast<int>(w.type)] != nullptr && w.cols % dtype_block_size(w.type) == 0 &&
         w.row_scales == nullptr && w.input_order == nullptr && w.data != nullptr;
}

repacked_buffer repack_for_active_level(thread_pool& pool, const std::vector<weight_view*>& weights,
                                        const std::function<void(const weight_view&)>& done) {
  const int R = active_quant_kernels().repack_rows;
  size_t total = 0;
  for (const weight_view* w : weights) {
    if (repacks_at_active_level(*w)) total += repacked_bytes(*w, R);
  }
  if (total == 0) return nullptr;
  repacked_buffer buffer = allocate_repacked(total);
  size_t at = 0;
  for (weight_view* w : weights) {
    if (!repacks_at_active_level(*w)) continue;
    populate_source_pages(*w);
    repack_weights_into(pool, *w, R, buffer.get() + at);
    w->repacked = buffer.get() + at;
    w->repack_rows = R;
    at += repacked_bytes(*w, R);
    if (done) done(*w);
  }
  return buffer;
}

void aligned_free::operator()(std::byte* p) const { std::free(p); }

bool has_repacked_layout(dtype type) { return repacked_block_bytes(type, 1) != 0; }

size_t repacked_tile_bytes(dtype type, int64_t k, int R) {
  if (!has_repacked_layout(type)) throw std::runtime_error("no repacked layout for " + std::string(dtype_name(type)));
  return static_cast<size_t>(k / dtype_block_size(type)) * repacked_block_bytes(type, R);
}

size_t repacked_bytes(const weight_view& w, int R) {
  const size_t tiles = static_cast<size_t>((w.rows + R - 1) / R);
  return (tiles * repacked_tile_bytes(w.type, w.cols, R) + 63) / 64 * 64;
}

repacked_buffer allocate_repacked(size_t bytes) {
  constexpr size_t huge_page = size_t{2} << 20;
  const bool huge = bytes >= huge_page;
  const size_t alignment = huge ? huge_page : 64;
  const size_t size = (bytes + alignment - 1) / alignment * alignment;
  repacked_buffer out(static_cast<std::byte*>(std::aligned_alloc(alignment, size)));
  if (!out) throw std::bad_alloc();
  // Advice only: without THP the buffer is ordinary pages. Only the whole 2 MiB pieces of what is
  // used are asked for in huge pages: the last, partly used piece stays in small pages, so only
  // its used pages become resident (as a huge page it made up to 2 MiB of nothing resident: 1.9
  // MiB beside a 38.6 MiB Q4_K_M model, tests/e2e/memory_e2e_test.cpp).
  if (huge) madvise(out.get(), bytes / huge_page * huge_page, MADV_HUGEPAGE);
  return out;
}

void repack_weights_into(thread_pool& pool, const weight_view& w, int R, std::byte* out) {
  if (!has_repacked_layout(w.type)) {
    throw std::runtime_error("no repacked layout for " + std::string(dtype_name(w.type)) + " weights");
  }
  if (w.cols % dtype_block_size(w.type) != 0) {
    throw std::runtime_error("repacking a " + std::string(dtype_name(w.type)) + " weight of " + std::to_string(w.cols) +
                             " columns, expected a multiple of " + std::to_string(dtype_block_size(w.type)));
  }
  const int64_t num_tiles = (w.rows + R - 1) / R;
  const size_t used = static_cast<size_t>(num_tiles) * repacked_tile_bytes(w.type, w.cols, R);
  std::memset(out + used, 0, repacked_bytes(w, R) - used);
  // Every byte of a whole tile is written, so the buffer is not cleared first: its pages are
  // first touched by the pool's threads, in parallel.
  auto run = [&](auto block) {
    pool.parallel_for(0, num_tiles, 1, [&](int64_t begin, int64_t end, int) {
      repack_tiles<decltype(block)::value>(w, R, begin, end, out);
    });
  };
  switch (w.type) {
    case dtype::q4_k: run(std::integral_constant<repack_block_fn, &repack_q4_k_block>{}); break;
    case dtype::q5_k: run(std::integral_constant<repack_block_fn, &repack_q5_k_block>{}); break;
    case dtype::q6_k: run(std::integral_constant<repack_block_fn, &repack_q6_k_block>{}); break;
    case dtype::iq4_xs: run(std::integral_constant<repack_block_fn, &repack_iq4_xs_block>{}); break;
    case dtype::q4_0: run(std::integral_constant<repack_block_fn, &repack_q4_0_block>{}); break;
    case dtype::q8_0: run(std::integral_constant<repack_block_fn, &repack_q8_0_block>{}); break;
    default: break;  // refused above
  }
}

repacked_buffer repack_weights(thread_pool& pool, const weight_view& w, int R) {
  if (!has_repacked_layout(w.type)) {
    throw std::runtime_error("no repacked layout for " + std::string(dtype_name(w.type)) + " weights");
  }
  repacked_buffer out = allocate_repacked(repacked_bytes(w, R));
  repack_weights_into(pool, w, R, out.get());
  return out;
}

size_t release_source_pages(const weight_view& w) {
  if (w.data == nullptr || !in_file_mapping(w.data)) return 0;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(w.data);
  const uintptr_t end = begin + row_bytes(w.type, w.cols) * static_cast<size_t>(w.rows);
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = end / page * page;
  if (last <= first) return 0;
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
  return last - first;
}

}  // namespace troupe::cpu
