#pragma once
// The integer kernels over repacked Q4_K, Q5_K, IQ4_XS, Q6_K, Q4_0 and Q8_0 tiles (quant_repack.hpp
// for the layout), written over the same SIMD traits V as quant_kernels_impl.hpp and included at
// its end. It computes the canonical sum of quant_kernels_impl.hpp in the same order with the same
// roundings (D = d * sc and M = -dmin * m per sub-block, one fma per 32-element activation block),
// so its outputs equal quant_matmul's bit for bit: only where the codes and scales come from
// differs (two nibble masks per 64 bytes, plus Q5_K's fifth or Q6_K's top bits, or IQ4_XS's level
// lookup, instead of a decode and a transpose per chunk).

#include <type_traits>

namespace troupe::cpu {
namespace {

// Adds the whole of one repacked tile (k / 256 super-blocks) of a type with 32-element
// sub-blocks (Q4_K, Q5_K, IQ4_XS) to the sums of N activation rows (x[j]: activation row j's
// first block); acc/accm [N][R] carry the sums out. Q5_K ors its fifth bits over the nibbles;
// IQ4_XS looks its levels up (biased by the policy's offset: unsigned for vpdpbusd, signed through
// the sign trick for maddubs, as its GGUF kernel decodes them).
template <class V, class T, int N>
void multiply_k32_repacked(const std::byte* tile, int64_t num_super, const act_block* const* x, float* acc_mem,
                           float* accm_mem, bool prefetch) {
  using policy = code_policy<V, T>;
  constexpr int R = V::R;
  constexpr bool five_bits = T::type == dtype::q5_k;
  constexpr bool levels = T::type == dtype::iq4_xs;
  static_assert(levels || (!policy::sign_trick && policy::offset == 0), "repacked Q4_K/Q5_K codes are unsigned");
  constexpr size_t block_bytes = repacked_block_bytes(T::type, R);
  constexpr size_t codes_bytes = (five_bits ? 128 + 32 : 128) * R;
  typename V::wreg table_reg = V::izero();
  if constexpr (levels) table_reg = V::table16(biased<policy::offset>(quant::iq4_levels).levels);
  typename V::freg acc[N], accm[N];
  for (int j = 0; j < N; ++j) acc[j] = accm[j] = V::fzero();
  for (int64_t b = 0; b < num_super; ++b) {
    const std::byte* block = tile + b * block_bytes;
    const uint8_t* codes = reinterpret_cast<const uint8_t*>(block);                    // [32][R][4]
    const uint8_t* high = codes + 128 * R;                                             // [8][R][4] (Q5_K)
    const float* d = reinterpret_cast<const float*>(block + codes_bytes);              // [R]
    const float* neg_dmin = d + R;                                                     // [R] (with a min)
    const int8_t* sc = reinterpret_cast<const int8_t*>(d + (T::has_min ? 2 : 1) * R);  // [8][R]
    const int8_t* m = sc + 8 * R;                                                      // [8][R] (with a min)
    if (prefetch && b + 1 < num_super) {
      // Into L2 (prefetcht1), as every prefetch of a repacked kernel: a block's lines asked for
      // at once into L1 wait on its few miss buffers and stall the loads behind them (1.1 B
      // model decode, 2 threads: Q4_K_M 1.15-1.3x, Q4_0 1.02-1.13x).
      const std::byte* next = block + block_bytes;
      for (size_t off = 0; off < block_bytes; off += 64) __builtin_prefetch(next + off, 0, 2);
    }
    const typename V::freg dv = V::fload(d);
    typename V::freg neg_dminv = V::fzero();
    if constexpr (T::has_min) neg_dminv = V::fload(neg_dmin);
    for (int s = 0; s < 8; ++s) {
      const int64_t ab = b * 8 + s;  // activation block
      typename V::ireg dot[N];
      for (int j = 0; j < N; ++j) dot[j] = V::izero();
      typename V::wreg top = V::izero();
      if constexpr (five_bits) top = V::load_w(high + s * R * 4);
      auto add_pair = [&](auto p) {
        constexpr int P = decltype(p)::value;
        const typename V::wreg packed = V::load_w(codes + (s * 4 + P) * R * 4);
        typename V::wreg lo = V::low_nibbles(packed);
        typename V::wreg hi = V::high_nibbles(packed);
        if constexpr (five_bits) {
          lo = V::or_w(lo, V::template bit_to_4<2 * P>(top));
          hi = V::or_w(hi, V::template bit_to_4<2 * P + 1>(top));
        }
        if constexpr (levels) {
          lo = V::lookup16(table_reg, lo);
          hi = V::lookup16(table_reg, hi);
        }
        if constexpr (policy::sign_trick) {
          const typename V::wreg lo_abs = V::abs8(lo);
          const typename V::wreg hi_abs = V::abs8(hi);
          for (int j = 0; j < N; ++j) {
            dot[j] = V::dot4_signed(dot[j], lo, lo_abs, load_a4(x[j][ab].q + 8 * P));
            dot[j] = V::dot4_signed(dot[j], hi, hi_abs, load_a4(x[j][ab].q + 8 * P + 4));
          }
        } else {
          for (int j = 0; j < N; ++j) {
            dot[j] = V::dot4(dot[j], lo, load_a4(x[j][ab].q + 8 * P));
            dot[j] = V::dot4(dot[j], hi, load_a4(x[j][ab].q + 8 * P + 4));
          }
        }
      };
      add_pair(std::integral_constant<int, 0>{});
      add_pair(std::integral_constant<int, 1>{});
      add_pair(std::integral_constant<int, 2>{});
      add_pair(std::integral_constant<int, 3>{});
      const typename V::freg D = V::fmul(dv, V::cvt_codes(sc + s * R));
      for (int j = 0; j < N; ++j) {
        if constexpr (policy::offset != 0) dot[j] = V::isub(dot[j], x[j][ab].corr[0]);
        acc[j] = V::fma(V::cvt(dot[j]), V::fmul(D, V::fset1(x[j][ab].d)), acc[j]);
      }
      if constexpr (T::has_min) {
        const typename V::freg M = V::fmul(neg_dminv, V::cvt_codes(m + s * R));
        for (int j = 0; j < N; ++j) accm[j] = V::fma(M, V::fset1(x[j][ab].dsum[0]), accm[j]);
      }
    }
  }
  for (int j = 0; j < N; ++j) {
    V::fstore(acc_mem + j * R, acc[j]);
    if constexpr (T::has_min) V::fstore(accm_mem + j * R, accm[j]);
  }
}

// The same for repacked Q6_K: sub-blocks of 16, codes 0..63 standing for code - 32 (the
// activations' corr takes the 32 back out, as in quant_matmul), no min.
template <class V, int N>
void multiply_q6_k_repacked(const std::byte* tile, int64_t num_super, const act_block* const* x, float* acc_mem, float*,
                            bool prefetch) {
  using policy = code_policy<V, q6_k_codes>;
  static_assert(!policy::sign_trick && policy::offset == 32, "repacked Q6_K codes are the unsigned 6-bit q");
  constexpr int R = V::R;
  typename V::freg acc[N];
  for (int j = 0; j < N; ++j) acc[j] = V::fzero();
  for (int64_t b = 0; b < num_super; ++b) {
    const std::byte* block = tile + b * q6_k_repacked_block_bytes(R);
    const uint8_t* low = reinterpret_cast<const uint8_t*>(block);    // [32][R][4]
    const uint8_t* high = low + 128 * R;                             // [16][R][4]
    const float* d = reinterpret_cast<const float*>(high + 64 * R);  // [R]
    const int8_t* sc = reinterpret_cast<const int8_t*>(d + R);       // [16][R]
    if (prefetch && b + 1 < num_super) {
      const std::byte* next = block + q6_k_repacked_block_bytes(R);
      for (size_t off = 0; off < q6_k_repacked_block_bytes(R); off += 64) __builtin_prefetch(next + off, 0, 2);
    }
    const typename V::freg dv = V::fload(d);
    for (int s = 0; s < 16; ++s) {
      const int64_t ab = b * 8 + s / 2;  // activation block
      const int h = s % 2;               // which half of it
      const typename V::wreg top = V::load_w(high + s * R * 4);
      const typename V::wreg pair0 = V::load_w(low + (2 * s) * R * 4);
      const typename V::wreg pair1 = V::load_w(low + (2 * s + 1) * R * 4);
      const typename V::wreg g0 = V::or_w(V::low_nibbles(pair0), V::template top_bits<0>(top));
      const typename V::wreg g1 = V::or_w(V::high_nibbles(pair0), V::template top_bits<1>(top));
      const typename V::wreg g2 = V::or_w(V::low_nibbles(pair1), V::template top_bits<2>(top));
      const typename V::wreg g3 = V::or_w(V::high_nibbles(pair1), V::template top_bits<3>(top));
      const typename V::freg D = V::fmul(dv, V::cvt_codes(sc + s * R));
      for (int j = 0; j < N; ++j) {
        const int8_t* q = x[j][ab].q + 16 * h;
        typename V::ireg dot = V::izero();
        dot = V::dot4(dot, g0, load_a4(q));
        dot = V::dot4(dot, g1, load_a4(q + 4));
        dot = V::dot4(dot, g2, load_a4(q + 8));
        dot = V::dot4(dot, g3, load_a4(q + 12));
        dot = V::isub(dot, x[j][ab].corr[h]);
        acc[j] = V::fma(V::cvt(dot), V::fmul(D, V::fset1(x[j][ab].d)), acc[j]);
      }
    }
  }
  for (int j = 0; j < N; ++j) V::fstore(acc_mem + j * R, acc[j]);
}

// The same for repacked Q4_0 and Q8_0 (num_blocks 32-element blocks): one sub-block per
// activation block, D the block's f16 d widened. Q4_0's nibbles are its codes + 8, which is the
// offset its GGUF kernel shifts to; Q8_0's signed codes go through the sign trick without VNNI,
// and with it become code + 128 by flipping the sign bit, as the GGUF kernel's offset does.
template <class V, class T, int N>
void multiply_legacy_repacked(const std::byte* tile, int64_t num_blocks, const act_block* const* x, float* acc_mem,
                              float*, bool prefetch) {
  using policy = code_policy<V, T>;
  constexpr int R = V::R;
  constexpr bool q4 = T::type == dtype::q4_0;
  static_assert(!q4 || (!policy::sign_trick && policy::offset == 8), "repacked Q4_0 codes are the raw nibbles");
  static_assert(q4 || policy::sign_trick || policy::offset == 128, "repacked Q8_0 codes are signed bytes");
  constexpr size_t block_bytes = q4 ? q4_0_repacked_block_bytes(R) : q8_0_repacked_block_bytes(R);
  constexpr size_t codes_bytes = q4 ? 16 * R : 32 * R;
  // Prefetch this far ahead: a few hundred bytes per block do not keep the prefetchers ahead.
  constexpr int64_t ahead = 8;
  typename V::freg acc[N];
  for (int j = 0; j < N; ++j) acc[j] = V::fzero();
  for (int64_t b = 0; b < num_blocks; ++b) {
    const std::byte* block = tile + b * block_bytes;
    const uint8_t* codes = reinterpret_cast<const uint8_t*>(block);              // [groups][R][4]
    const uint16_t* d = reinterpret_cast<const uint16_t*>(block + codes_bytes);  // [R]
    if (prefetch && b % ahead == 0 && b + ahead < num_blocks) {
      const std::byte* next = block + ahead * block_bytes;
      const size_t span = static_cast<size_t>(smaller(ahead, num_blocks - b - ahead)) * block_bytes;
      for (size_t off = 0; off < span; off += 64) __builtin_prefetch(next + off, 0, 2);
    }
    typename V::ireg dot[N];
    for (int j = 0; j < N; ++j) dot[j] = V::izero();
    if constexpr (q4) {
      for (int p = 0; p < 4; ++p) {
        const typename V::wreg packed = V::load_w(codes + p * R * 4);
        const typename V::wreg lo = V::low_nibbles(packed);
        const typename V::wreg hi = V::high_nibbles(packed);
        for (int j = 0; j < N; ++j) {
          dot[j] = V::dot4(dot[j], lo, load_a4(x[j][b].q + 8 * p));
          dot[j] = V::dot4(dot[j], hi, load_a4(x[j][b].q + 8 * p + 4));
        }
      }
    } else {
      for (int g = 0; g < 8; ++g) {
        const typename V::wreg wv = V::load_w(codes + g * R * 4);
        if constexpr (policy::sign_trick) {
          const typename V::wreg wabs = V::abs8(wv);
          for (int j = 0; j < N; ++j) dot[j] = V::dot4_signed(dot[j], wv, wabs, load_a4(x[j][b].q + 4 * g));
        } else {
          const typename V::wreg wu = V::plus_128(wv);
          for (int j = 0; j < N; ++j) dot[j] = V::dot4(dot[j], wu, load_a4(x[j][b].q + 4 * g));
        }
      }
    }
    const typename V::freg D = V::fload_half(d);
    for (int j = 0; j < N; ++j) {
      if constexpr (policy::offset != 0) dot[j] = V::isub(dot[j], x[j][b].corr[0]);
      acc[j] = V::fma(V::cvt(dot[j]), V::fmul(D, V::fset1(x[j][b].d)), acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) V::fstore(acc_mem + j * R, acc[j]);
}

// num_blocks: blocks of T (256 elements for the k-quants, 32 for the legacy types). prefetch:
// whether this pass is the first over the tile (the one that reads it from memory); the passes of
// further activation rows find it in cache, and prefetching it again cost Q8_0 prompts a third
// of their speed.
template <class V, class T, int N>
void multiply_repacked(const std::byte* tile, int64_t num_blocks, const act_block* const* x, float* acc, float* accm,
                       bool prefetch) {
  if constexpr (T::type == dtype::q4_k || T::type == dtype::q5_k || T::type == dtype::iq4_xs) {
    multiply_k32_repacked<V, T, N>(tile, num_blocks, x, acc, accm, prefetch);
  } else if constexpr (T::type == dtype::q6_k) {
    multiply_q6_k_repacked<V, N>(tile, num_blocks, x, acc, accm, prefetch);
  } else {
    multiply_legacy_repacked<V, T, N>(tile, num_blocks, x, acc, accm, prefetch);
  }
}

// quant_matmul_fn over a repacked type: w is the first tile of the rows asked for (num_rows from a
// tile boundary); each tile is read from memory once and, for more than act_rows activation
// rows, again from cache by each further group of act_rows.
template <class V, class T>
void quant_matmul_repacked(const std::byte* w, int64_t k, int64_t num_rows, const act_block* x, int64_t n, float* y,
                           int64_t ldy, std::byte*) {
  constexpr int R = V::R;
  constexpr int A = V::act_rows;
  const int64_t num_super = k / T::block;  // blocks of T along a row
  const size_t tile_bytes = static_cast<size_t>(num_super) * repacked_block_bytes(T::type, R);
  const int64_t x_blocks = k / 32;
  alignas(64) float acc[A * R];   // [A][R]
  alignas(64) float accm[A * R];  // [A][R]
  for (int64_t r0 = 0; r0 < num_rows; r0 += R) {
    const std::byte* tile = w + (r0 / R) * tile_bytes;
    const int rows = static_cast<int>(smaller(R, num_rows - r0));
    for (int64_t j0 = 0; j0 < n; j0 += A) {
      const int64_t count = smaller(A, n - j0);
      const act_block* rows_x[A];
      for (int64_t i = 0; i < count; ++i) rows_x[i] = x + (j0 + i) * x_blocks;
      switch (count) {
        case 1: multiply_repacked<V, T, 1>(tile, num_super, rows_x, acc, accm, j0 == 0); break;
        case 2:
          if constexpr (A >= 2) multiply_repacked<V, T, 2>(tile, num_super, rows_x, acc, accm, j0 == 0);
          break;
        case 3:
          if constexpr (A >= 3) multiply_repacked<V, T, 3>(tile, num_super, rows_x, acc, accm, j0 == 0);
          break;
        default: multiply_repacked<V, T, A>(tile, num_super, rows_x, acc, accm, j0 == 0); break;
      }
      for (int64_t i = 0; i < count; ++i) {
        float* out = y + (j0 + i) * ldy + r0;
        for (int r = 0; r < rows; ++r) out[r] = T::has_min ? acc[i * R + r] + accm[i * R + r] : acc[i * R + r];
      }
    }
  }
}

}  // namespace
}  // namespace troupe::cpu
