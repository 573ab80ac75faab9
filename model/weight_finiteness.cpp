#include "model/weight_finiteness.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace troupe {

namespace {

// Elements per chunk: a chunk is first tested whole at vector width (is any element's exponent
// all ones?); only a chunk with a hit is searched again, element by element, for the position and
// the -inf exception. Large enough that the per-chunk call costs nothing, small enough (32-64 KiB)
// that the search finds the chunk still in cache.
constexpr int64_t chunk_elements = 16384;

// ---- the tests "does any of `count` elements have all of `mask`'s bits set", per width ----

template <typename Bits>
bool any_all_ones_scalar(const std::byte* data, int64_t count, Bits mask) {
  Bits any = 0;
  for (int64_t i = 0; i < count; ++i) {  // branch-free: the compiler vectorizes it at the baseline ISA
    Bits bits;
    std::memcpy(&bits, data + i * static_cast<int64_t>(sizeof(Bits)), sizeof(Bits));
    any |= static_cast<Bits>((bits & mask) == mask);
  }
  return any != 0;
}

#if defined(__x86_64__)

// The lanes of `v` whose `m` bits are all set. (Helpers, not lambdas: a lambda does not take its
// enclosing function's target ISA.)
__attribute__((target("avx2"))) inline __m256i all_ones_lanes_u16(const std::byte* p, __m256i m) {
  return _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), m), m);
}
__attribute__((target("avx2"))) inline __m256i all_ones_lanes_u32(const std::byte* p, __m256i m) {
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), m), m);
}

// Four vectors per step: four load streams keep the memory system busy.
__attribute__((target("avx2"))) bool any_all_ones_avx2_u16(const std::byte* data, int64_t count, uint16_t mask) {
  const __m256i m = _mm256_set1_epi16(static_cast<short>(mask));
  __m256i any = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 64 <= count; i += 64) {
    const std::byte* p = data + i * 2;
    any = _mm256_or_si256(
        any, _mm256_or_si256(_mm256_or_si256(all_ones_lanes_u16(p, m), all_ones_lanes_u16(p + 32, m)),
                             _mm256_or_si256(all_ones_lanes_u16(p + 64, m), all_ones_lanes_u16(p + 96, m))));
  }
  for (; i + 16 <= count; i += 16) any = _mm256_or_si256(any, all_ones_lanes_u16(data + i * 2, m));
  return !_mm256_testz_si256(any, any) || any_all_ones_scalar<uint16_t>(data + i * 2, count - i, mask);
}

__attribute__((target("avx2"))) bool any_all_ones_avx2_u32(const std::byte* data, int64_t count, uint32_t mask) {
  const __m256i m = _mm256_set1_epi32(static_cast<int>(mask));
  __m256i any = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const std::byte* p = data + i * 4;
    any = _mm256_or_si256(
        any, _mm256_or_si256(_mm256_or_si256(all_ones_lanes_u32(p, m), all_ones_lanes_u32(p + 32, m)),
                             _mm256_or_si256(all_ones_lanes_u32(p + 64, m), all_ones_lanes_u32(p + 96, m))));
  }
  for (; i + 8 <= count; i += 8) any = _mm256_or_si256(any, all_ones_lanes_u32(data + i * 4, m));
  return !_mm256_testz_si256(any, any) || any_all_ones_scalar<uint32_t>(data + i * 4, count - i, mask);
}

__attribute__((target("avx512f,avx512bw"))) inline __mmask32 all_ones_lanes_u16(const std::byte* p, __m512i m) {
  return _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(p), m), m);
}
__attribute__((target("avx512f"))) inline __mmask16 all_ones_lanes_u32(const std::byte* p, __m512i m) {
  return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(p), m), m);
}

// The tail is one masked load: the lanes past the end read as 0, which never matches.
__attribute__((target("avx512f,avx512bw"))) bool any_all_ones_avx512_u16(const std::byte* data, int64_t count,
                                                                         uint16_t mask) {
  const __m512i m = _mm512_set1_epi16(static_cast<short>(mask));
  __mmask32 any = 0;
  int64_t i = 0;
  for (; i + 128 <= count; i += 128) {
    const std::byte* p = data + i * 2;
    any |= all_ones_lanes_u16(p, m) | all_ones_lanes_u16(p + 64, m) | all_ones_lanes_u16(p + 128, m) |
           all_ones_lanes_u16(p + 192, m);
  }
  for (; i + 32 <= count; i += 32) any |= all_ones_lanes_u16(data + i * 2, m);
  if (i < count) {
    const auto tail = static_cast<__mmask32>((uint64_t(1) << (count - i)) - 1);
    any |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_maskz_loadu_epi16(tail, data + i * 2), m), m);
  }
  return any != 0;
}

__attribute__((target("avx512f"))) bool any_all_ones_avx512_u32(const std::byte* data, int64_t count, uint32_t mask) {
  const __m512i m = _mm512_set1_epi32(static_cast<int>(mask));
  __mmask16 any = 0;
  int64_t i = 0;
  for (; i + 64 <= count; i += 64) {
    const std::byte* p = data + i * 4;
    any |= all_ones_lanes_u32(p, m) | all_ones_lanes_u32(p + 64, m) | all_ones_lanes_u32(p + 128, m) |
           all_ones_lanes_u32(p + 192, m);
  }
  for (; i + 16 <= count; i += 16) any |= all_ones_lanes_u32(data + i * 4, m);
  if (i < count) {
    const auto tail = static_cast<__mmask16>((1u << (count - i)) - 1);
    any |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_maskz_loadu_epi32(tail, data + i * 4), m), m);
  }
  return any != 0;
}

#endif

bool width_supported(finiteness_scan_width width) {
  switch (width) {
    case finiteness_scan_width::scalar: return true;
#if defined(__x86_64__)
    case finiteness_scan_width::avx2: return __builtin_cpu_supports("avx2");
    case finiteness_scan_width::avx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
    default: return false;
#endif
  }
  return false;
}

finiteness_scan_width widest_width() {
  static const finiteness_scan_width widest = supported_finiteness_scan_widths().back();
  return widest;
}

template <typename Bits>
bool any_all_ones(finiteness_scan_width width, const std::byte* data, int64_t count, Bits mask) {
#if defined(__x86_64__)
  if constexpr (sizeof(Bits) == 2) {
    if (width == finiteness_scan_width::avx512) return any_all_ones_avx512_u16(data, count, mask);
    if (width == finiteness_scan_width::avx2) return any_all_ones_avx2_u16(data, count, mask);
  } else {
    if (width == finiteness_scan_width::avx512) return any_all_ones_avx512_u32(data, count, mask);
    if (width == finiteness_scan_width::avx2) return any_all_ones_avx2_u32(data, count, mask);
  }
#endif
  return any_all_ones_scalar<Bits>(data, count, mask);
}

// The first element whose exponent bits are all ones (NaN or infinity) and which is not
// `negative_infinity` (the bit pattern of -inf when it is allowed, else 0, which is finite).
template <typename Bits>
std::optional<int64_t> first_all_ones_exponent(finiteness_scan_width width, const std::byte* data, int64_t count,
                                               Bits exponent_mask, Bits negative_infinity) {
  for (int64_t begin = 0; begin < count; begin += chunk_elements) {
    const int64_t end = std::min(count, begin + chunk_elements);
    if (!any_all_ones<Bits>(width, data + begin * static_cast<int64_t>(sizeof(Bits)), end - begin, exponent_mask)) {
      continue;
    }
    for (int64_t i = begin; i < end; ++i) {
      Bits bits;
      std::memcpy(&bits, data + i * static_cast<int64_t>(sizeof(Bits)), sizeof(Bits));
      if ((bits & exponent_mask) == exponent_mask && bits != negative_infinity) return i;
    }
  }
  return std::nullopt;
}

bool is_sink(const std::string& name) { return name.size() >= 6 && name.compare(name.size() - 6, 6, ".sinks") == 0; }

// Below this many bytes a store is scanned on the calling thread: starting threads costs more.
constexpr uint64_t threaded_scan_bytes = uint64_t(64) << 20;

}  // namespace

std::vector<finiteness_scan_width> supported_finiteness_scan_widths() {
  std::vector<finiteness_scan_width> widths;
  for (auto w : {finiteness_scan_width::scalar, finiteness_scan_width::avx2, finiteness_scan_width::avx512}) {
    if (width_supported(w)) widths.push_back(w);
  }
  return widths;
}

std::optional<int64_t> first_non_finite(const weight_tensor& tensor, bool allow_negative_infinity,
                                        std::optional<finiteness_scan_width> requested) {
  const finiteness_scan_width width = requested.value_or(widest_width());
  if (requested && !width_supported(width)) throw std::invalid_argument("this CPU lacks the finiteness scan's width");
  const bool allow = allow_negative_infinity;
  switch (tensor.type) {
    case dtype::f32:
      return first_all_ones_exponent<uint32_t>(width, tensor.data, static_cast<int64_t>(tensor.num_bytes / 4),
                                               0x7f800000u, allow ? 0xff800000u : 0u);
    case dtype::f16:
      return first_all_ones_exponent<uint16_t>(width, tensor.data, static_cast<int64_t>(tensor.num_bytes / 2), 0x7c00u,
                                               allow ? 0xfc00u : 0u);
    case dtype::bf16:
      return first_all_ones_exponent<uint16_t>(width, tensor.data, static_cast<int64_t>(tensor.num_bytes / 2), 0x7f80u,
                                               allow ? 0xff80u : 0u);
    default: return std::nullopt;
  }
}

void check_weights_finite(const weight_store& weights, const std::string& source, unsigned max_threads,
                          std::optional<finiteness_scan_width> width) {
  std::vector<std::pair<const std::string*, const weight_tensor*>> tensors;  // in name order
  for (const auto& [name, tensor] : weights.tensors()) tensors.emplace_back(&name, &tensor);
  // Threads take whole tensors in name order; the first bad one in that order is reported, so the
  // answer does not depend on the thread count. A thread stops at a tensor after a bad one.
  std::vector<std::optional<int64_t>> bad(tensors.size());
  std::atomic<size_t> next{0};
  std::atomic<size_t> first_bad{tensors.size()};
  auto scan = [&] {
    for (size_t t = next++; t < tensors.size() && t < first_bad; t = next++) {
      bad[t] = first_non_finite(*tensors[t].second, is_sink(*tensors[t].first), width);
      if (!bad[t]) continue;
      size_t seen = first_bad;
      while (t < seen && !first_bad.compare_exchange_weak(seen, t)) {
      }
    }
  };
  unsigned num_threads = max_threads != 0 ? max_threads : std::max(1u, std::thread::hardware_concurrency());
  if (weights.total_bytes() < threaded_scan_bytes) num_threads = 1;
  num_threads = std::min<unsigned>({num_threads, 16u, static_cast<unsigned>(std::max<size_t>(tensors.size(), 1))});
  std::vector<std::thread> helpers;
  for (unsigned i = 1; i < num_threads; ++i) helpers.emplace_back(scan);
  scan();
  for (std::thread& h : helpers) h.join();
  if (first_bad == tensors.size()) return;
  const auto& [name, tensor] = tensors[first_bad];
  const int64_t at = *bad[first_bad];
  const int64_t cols = tensor->cols();
  throw std::runtime_error("tensor " + *name + " of " + source + " holds a NaN or infinite value at element " +
                           std::to_string(at) + " (row " + std::to_string(at / cols) + ", column " +
                           std::to_string(at % cols) +
                           "): the file is damaged or was written from a run that diverged");
}

}  // namespace troupe
