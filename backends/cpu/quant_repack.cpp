#include "backends/cpu/quant_repack.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
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

bool has_repacked_layout(dtype type) { return type == dtype::q4_k; }

size_t repacked_tile_bytes(dtype type, int64_t k, int R) {
  if (type != dtype::q4_k) throw std::runtime_error("no repacked layout for " + std::string(dtype_name(type)));
  return static_cast<size_t>(k / super_block) * q4_k_repacked_block_bytes(R);
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
  pool.parallel_for(0, num_tiles, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      std::byte* tile = out.get() + t * tile_bytes;
      for (int r = 0; r < R && t * R + r < w.rows; ++r) {
        const std::byte* row = w.data + (t * R + r) * stride;
        for (int64_t b = 0; b < blocks; ++b) {
          repack_q4_k_block(row + b * 144, R, r, tile + b * q4_k_repacked_block_bytes(R));
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
