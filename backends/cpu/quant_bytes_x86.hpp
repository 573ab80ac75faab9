#pragma once
// The byte operations the block decoders are written in (quant_codes.hpp), on x86 with AVX2 (and
// AVX-512 BW/VL where Avx512 is set, for moving a bit mask into bytes). Included only by the
// ISA-flagged kernel files, inside their anonymous namespace.
//
//   nibbles32(src, add, out):                    out[i] = (src[i] & 15) + add, out[i + 16] =
//                                                (src[i] >> 4) + add, for i < 16 (one 32-byte store,
//                                                so a following 32-byte load is forwarded from it)
//   field32(src, shift, mask, add, out):         out[i]  = ((src[i] >> shift) & mask) + add
//   add_field32(src, shift, mask, up, out):      out[i] += ((src[i] >> shift) & mask) << up
//   add_bits32(bits, value, out):                out[i] += value where bit i of bits is set
//   lookup(table, codes, count):                 codes[i] = table[codes[i]]  (codes < 16)
//   add_bytes(codes, count, value):              codes[i] += value
//   half(bits):                                  an f16 as f32 (exact, F16C)

#include <immintrin.h>

#include <cstdint>

namespace troupe::cpu {
namespace {

template <bool Avx512>
struct x86_bytes {
  static __m128i shift_count(int shift) { return _mm_cvtsi32_si128(shift); }

  static void nibbles32(const uint8_t* src, int8_t add, int8_t* out) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m256i both = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), mask), _mm_and_si128(v, mask));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_add_epi8(both, _mm256_set1_epi8(add)));
  }
  static void field32(const uint8_t* src, int shift, uint8_t mask, int8_t add, int8_t* out) {
    __m256i v = _mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)), shift_count(shift));
    v = _mm256_add_epi8(_mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(mask))), _mm256_set1_epi8(add));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), v);
  }
  // mask << up stays inside a byte, so the 16-bit shifts never carry between bytes.
  static void add_field32(const uint8_t* src, int shift, uint8_t mask, int up, int8_t* out) {
    __m256i v = _mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)), shift_count(shift));
    v = _mm256_sll_epi16(_mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(mask))), shift_count(up));
    __m256i* dst = reinterpret_cast<__m256i*>(out);
    _mm256_storeu_si256(dst, _mm256_add_epi8(_mm256_loadu_si256(dst), v));
  }
  static void add_bits32(uint32_t bits, int8_t value, int8_t* out) {
    __m256i add;
    if constexpr (Avx512) {
      add = _mm256_maskz_set1_epi8(bits, value);
    } else {
      // Byte i takes byte i / 8 of bits, keeps bit i % 8, and becomes 0xff where it is set.
      const __m256i spread = _mm256_shuffle_epi8(
          _mm256_set1_epi32(static_cast<int>(bits)),
          _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
      const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
      add = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(value));
    }
    __m256i* dst = reinterpret_cast<__m256i*>(out);
    _mm256_storeu_si256(dst, _mm256_add_epi8(_mm256_loadu_si256(dst), add));
  }
  static void lookup(const int8_t* table, int8_t* codes, int count) {
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
    for (int i = 0; i < count; i += 32) {
      __m256i* p = reinterpret_cast<__m256i*>(codes + i);
      _mm256_storeu_si256(p, _mm256_shuffle_epi8(t, _mm256_loadu_si256(p)));
    }
  }
  static void add_bytes(int8_t* codes, int count, int8_t value) {
    for (int i = 0; i < count; i += 32) {
      __m256i* p = reinterpret_cast<__m256i*>(codes + i);
      _mm256_storeu_si256(p, _mm256_add_epi8(_mm256_loadu_si256(p), _mm256_set1_epi8(value)));
    }
  }
  static float half(uint16_t bits) { return _cvtsh_ss(bits); }
};

}  // namespace
}  // namespace troupe::cpu
