#include "backends/cpu/quant_repack.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

#include "backends/cpu/matmul.hpp"
#include "backends/cpu/quant_kernels.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "model/quant/block_fields.hpp"

namespace troupe::cpu {
namespace {

constexpr int64_t super_block = 256;

// One Q4_K block (144 bytes: d, dmin, 12 bytes of packed scales and mins, 128 bytes of nibbles)
// into lane r of a repacked super-block (layout in the header).
void repack_q4_k_block(const std::byte* block, int R, int r, std::byte* out) {
  uint8_t* codes = reinterpret_cast<uint8_t*>(out);  // [32][R][4]
  float* d = reinterpret_cast<float*>(out + 128 * R);  // [R]
  float* neg_dmin = d + R;                             // [R]
  int8_t* sc = reinterpret_cast<int8_t*>(neg_dmin + R);  // [8][R]
  int8_t* m = sc + 8 * R;                                // [8][R]
  d[r] = quant::read_f16(block);
  neg_dmin[r] = -quant::read_f16(block + 2);
  const uint8_t* packed = quant::bytes_at(block + 4);
  for (int s = 0; s < 8; ++s) {
    uint8_t scale, min;
    quant::k_scale_min(s, packed, &scale, &min);
    sc[s * R + r] = static_cast<int8_t>(scale);
    m[s * R + r] = static_cast<int8_t>(min);
  }
  // Element e of the block: 64-element group e / 64 has 32 bytes of qs, low nibbles the first 32.
  const uint8_t* qs = quant::bytes_at(block + 16);
  auto code = [&](int e) -> uint8_t {
    const uint8_t byte = qs[32 * (e / 64) + e % 32];
    return (e % 64) < 32 ? byte & 0x0f : byte >> 4;
  };
  for (int p = 0; p < 32; ++p) {
    for (int i = 0; i < 4; ++i) {
      codes[(p * R + r) * 4 + i] = static_cast<uint8_t>(code(8 * p + i) | (code(8 * p + 4 + i) << 4));
    }
  }
}

// One Q6_K block (210 bytes: ql 128, qh 64, sc 16, d) into lane r of a repacked super-block.
void repack_q6_k_block(const std::byte* block, int R, int r, std::byte* out) {
  uint8_t* low = reinterpret_cast<uint8_t*>(out);           // [32][R][4]
  uint8_t* high = low + 128 * R;                             // [16][R][4]
  float* d = reinterpret_cast<float*>(high + 64 * R);        // [R]
  int8_t* sc = reinterpret_cast<int8_t*>(d + R);             // [16][R]
  d[r] = quant::read_f16(block + 208);
  for (int s = 0; s < 16; ++s) sc[s * R + r] = static_cast<int8_t>(quant::bytes_at(block + 192)[s]);
  // Element 128 h + 32 t + l (l < 32): low bits from ql[64 h + 32 (t & 1) + l] (nibble t >> 1),
  // top bits from bits 2t, 2t + 1 of qh[32 h + l].
  const uint8_t* ql = quant::bytes_at(block);
  const uint8_t* qh = quant::bytes_at(block + 128);
  auto low_bits = [&](int e) -> uint8_t {
    const int h = e / 128, t = (e % 128) / 32, l = e % 32;
    return (ql[64 * h + 32 * (t & 1) + l] >> (4 * (t >> 1))) & 0x0f;
  };
  auto high_bits = [&](int e) -> uint8_t {
    const int h = e / 128, t = (e % 128) / 32, l = e % 32;
    return (qh[32 * h + l] >> (2 * t)) & 3;
  };
  for (int p = 0; p < 32; ++p) {
    for (int i = 0; i < 4; ++i) {
      low[(p * R + r) * 4 + i] = static_cast<uint8_t>(low_bits(8 * p + i) | (low_bits(8 * p + 4 + i) << 4));
    }
  }
  for (int s = 0; s < 16; ++s) {
    for (int i = 0; i < 4; ++i) {
      uint8_t byte = 0;
      for (int t = 0; t < 4; ++t) byte = static_cast<uint8_t>(byte | (high_bits(16 * s + 4 * t + i) << (2 * t)));
      high[(s * R + r) * 4 + i] = byte;
    }
  }
}

// Whether p lies in a mapping of a file (a path or an inode in /proc/self/maps).
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

std::atomic<bool> repacking{true};

size_t block_bytes_of(dtype type, int R) {
  return type == dtype::q4_k ? q4_k_repacked_block_bytes(R) : q6_k_repacked_block_bytes(R);
}

}  // namespace

bool weight_repacking() { return repacking.load(std::memory_order_relaxed); }
void set_weight_repacking(bool on) { repacking.store(on, std::memory_order_relaxed); }

bool repack_for_active_level(thread_pool& pool, weight_view& w, std::vector<repacked_buffer>& owned) {
  const quant_kernels& kernels = active_quant_kernels();
  if (!weight_repacking() || !matmul_integer_kernels() || kernels.repack_rows == 0 ||
      kernels.matmul_repacked[static_cast<int>(w.type)] == nullptr || w.cols % super_block != 0 ||
      w.row_scales != nullptr || w.input_order != nullptr || w.data == nullptr) {
    return false;
  }
  owned.push_back(repack_weights(pool, w, kernels.repack_rows));
  w.repacked = owned.back().get();
  w.repack_rows = kernels.repack_rows;
  return true;
}

void aligned_free::operator()(std::byte* p) const { std::free(p); }

bool has_repacked_layout(dtype type) { return type == dtype::q4_k || type == dtype::q6_k; }

size_t repacked_tile_bytes(dtype type, int64_t k, int R) {
  if (!has_repacked_layout(type)) throw std::runtime_error("no repacked layout for " + std::string(dtype_name(type)));
  return static_cast<size_t>(k / super_block) * block_bytes_of(type, R);
}

repacked_buffer repack_weights(thread_pool& pool, const weight_view& w, int R) {
  if (!has_repacked_layout(w.type)) {
    throw std::runtime_error("no repacked layout for " + std::string(dtype_name(w.type)) + " weights");
  }
  if (w.cols % super_block != 0) {
    throw std::runtime_error("repacking a " + std::string(dtype_name(w.type)) + " weight of " + std::to_string(w.cols) +
                             " columns, expected a multiple of 256");
  }
  const int64_t num_tiles = (w.rows + R - 1) / R;
  const size_t tile_bytes = repacked_tile_bytes(w.type, w.cols, R);
  const size_t total = (num_tiles * tile_bytes + 63) / 64 * 64;
  repacked_buffer out(static_cast<std::byte*>(std::aligned_alloc(64, total)));
  if (!out) throw std::bad_alloc();
  std::memset(out.get(), 0, total);  // lanes past the last row: zero codes and scales
  const size_t stride = row_bytes(w.type, w.cols);
  const int64_t blocks = w.cols / super_block;
  const size_t source_block_bytes = dtype_traits_of(w.type).block_bytes;  // GGUF's: 144 (Q4_K), 210 (Q6_K)
  const size_t out_block_bytes = block_bytes_of(w.type, R);
  pool.parallel_for(0, num_tiles, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      std::byte* tile = out.get() + t * tile_bytes;
      for (int r = 0; r < R && t * R + r < w.rows; ++r) {
        const std::byte* row = w.data + (t * R + r) * stride;
        for (int64_t b = 0; b < blocks; ++b) {
          std::byte* out_block = tile + b * out_block_bytes;
          const std::byte* block = row + b * source_block_bytes;
          if (w.type == dtype::q4_k) {
            repack_q4_k_block(block, R, r, out_block);
          } else {
            repack_q6_k_block(block, R, r, out_block);
          }
        }
      }
    }
  });
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
