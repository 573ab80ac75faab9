#pragma once
// Quantized Hugging Face checkpoints written the way the quantization tools write them, from
// known integer codes, zeros and scales, for the loader tests. Each packer follows its tool's
// own code (cited at each one) and shares nothing with Troupe's unpackers
// (model/loader/int4_checkpoints.cpp, fp8_checkpoint.cpp): a wrong bit order on either side
// shows as a mismatch against the known values.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/half_float.hpp"
#include "model/loader/safetensors_file.hpp"
#include "model/quant/fp8.hpp"

namespace troupe::test {

// A tensor to write, owning its bytes.
struct owned_tensor {
  std::string name;
  std::string type;  // safetensors dtype: "I32", "F16", "BF16", "F32", "F8_E4M3", "I64"
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

inline safetensors_tensor view_of(const owned_tensor& t) {
  return {t.name, t.type, t.shape, t.bytes.data(), t.bytes.size(), "test"};
}

inline std::vector<safetensors_tensor> views_of(const std::vector<owned_tensor>& tensors) {
  std::vector<safetensors_tensor> views;
  for (const auto& t : tensors) views.push_back(view_of(t));
  return views;
}

template <typename T>
owned_tensor make_tensor(const std::string& name, const std::string& type, std::vector<int64_t> shape,
                         const std::vector<T>& values) {
  owned_tensor t{name, type, std::move(shape), std::vector<std::byte>(values.size() * sizeof(T))};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

// Floats stored as `type` (F32, F16 or BF16).
inline owned_tensor float_tensor(const std::string& name, const std::string& type, std::vector<int64_t> shape,
                                 const std::vector<float>& values) {
  if (type == "F32") return make_tensor(name, type, std::move(shape), values);
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = type == "F16" ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
  return make_tensor(name, type, std::move(shape), bits);
}

// A 4-bit layer before packing: value(o, i) = scale[g, o] * (code[o, i] - zero[g, o]), g = group[i].
struct int4_codes {
  int64_t out = 0, in = 0, groups = 0;
  std::vector<uint8_t> code;   // [out, in], 0..15
  std::vector<uint8_t> zero;   // [groups, out], 0..15
  std::vector<float> scale;    // [groups, out]
  std::vector<int32_t> group;  // [in]

  double value(int64_t o, int64_t i) const {
    const int64_t g = group[i];
    return static_cast<double>(scale[g * out + o]) * (static_cast<int>(code[o * in + i]) - zero[g * out + o]);
  }
};

// A scale of 7 significant bits, so that scale, zero * scale (zero < 16) and scale * e4m3 are
// exact in f16, bf16 and f32 and the loaded values can be compared for equality.
inline float short_scale(std::mt19937& rng, int min_exponent, int max_exponent) {
  const int mantissa = std::uniform_int_distribution<int>(64, 127)(rng);
  return std::ldexp(static_cast<float>(mantissa), std::uniform_int_distribution<int>(min_exponent, max_exponent)(rng));
}

// group_size 0: one group per row. act_order: columns are assigned to groups in a random order,
// as GPTQ's desc_act does (g_idx[perm[j]] = j / group_size). symmetric: every zero is 8.
inline int4_codes random_int4(int64_t out, int64_t in, int64_t group_size, bool act_order, bool symmetric,
                              uint32_t seed) {
  std::mt19937 rng(seed);
  int4_codes c;
  c.out = out;
  c.in = in;
  const int64_t g = group_size > 0 ? group_size : in;
  c.groups = (in + g - 1) / g;
  c.group.resize(in);
  std::vector<int32_t> order(in);
  std::iota(order.begin(), order.end(), 0);
  if (act_order) std::shuffle(order.begin(), order.end(), rng);
  for (int64_t j = 0; j < in; ++j) c.group[order[j]] = static_cast<int32_t>(j / g);
  std::uniform_int_distribution<int> nibble(0, 15);
  c.code.resize(out * in);
  for (auto& q : c.code) q = static_cast<uint8_t>(nibble(rng));
  c.zero.resize(c.groups * out);
  for (auto& z : c.zero) z = symmetric ? 8 : static_cast<uint8_t>(nibble(rng));
  if (!symmetric) c.zero[0] = 0;  // a zero of 0: GPTQ v1 stores it as -1, borrowing from its neighbour
  c.scale.resize(c.groups * out);
  for (auto& s : c.scale) s = short_scale(rng, -16, -8);
  return c;
}

// Packs 8 nibbles into a word, nibble k from value_of(k).
template <typename F>
int32_t pack_word(F value_of) {
  uint32_t word = 0;
  for (int k = 0; k < 8; ++k) word |= static_cast<uint32_t>(value_of(k) & 15) << (4 * k);
  return static_cast<int32_t>(word);
}

// AutoAWQ GEMM (awq/modules/linear/gemm.py, WQLinear_GEMM.from_linear): intweight is [in, out];
// qweight[:, col] |= intweight[:, col * 8 + order_map[i]] << (i * 4) with order_map
// [0, 2, 4, 6, 1, 3, 5, 7]; qzeros packed the same way from zeros [in / g, out]; scales f16
// [in / g, out]. Groups are runs of group_size input rows.
// The tools pack 8 nibbles per int32 along a dimension: it must be a multiple of 8.
inline void require_multiple_of_8(int64_t size, const std::string& what) {
  if (size % 8 != 0) throw std::invalid_argument(what + " " + std::to_string(size) + " is not a multiple of 8");
}

inline std::vector<owned_tensor> pack_awq(const std::string& prefix, const int4_codes& c) {
  static constexpr int order_map[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  require_multiple_of_8(c.out, prefix + " out_features");
  const int64_t words = c.out / 8;
  std::vector<int32_t> qweight(c.in * words), qzeros(c.groups * words);
  for (int64_t i = 0; i < c.in; ++i)
    for (int64_t col = 0; col < words; ++col)
      qweight[i * words + col] = pack_word([&](int k) { return c.code[(col * 8 + order_map[k]) * c.in + i]; });
  for (int64_t g = 0; g < c.groups; ++g)
    for (int64_t col = 0; col < words; ++col)
      qzeros[g * words + col] = pack_word([&](int k) { return c.zero[g * c.out + col * 8 + order_map[k]]; });
  return {make_tensor(prefix + ".qweight", "I32", {c.in, words}, qweight),
          make_tensor(prefix + ".qzeros", "I32", {c.groups, words}, qzeros),
          float_tensor(prefix + ".scales", "F16", {c.groups, c.out}, c.scale)};
}

// GPTQ (GPTQModel's pack_block, as AutoGPTQ's QuantLinear.pack before it): qweight [in / 8, out]
// holds input rows 8w .. 8w+7 of output column o in word (w, o), row 8w + k at bits 4k; qzeros
// [groups, out / 8] holds zeros[:, 8c + k] at bits 4k of word c; scales f16 [groups, out]; g_idx
// int32 [in]. The v1 format ("gptq") then subtracts 0b00010001...0001 from every qzeros word
// (GPTQModel's convert_gptq_v2_to_v1_format), an int32 subtraction whose borrow crosses into the
// next nibble where a zero is 0.
inline std::vector<owned_tensor> pack_gptq(const std::string& prefix, const int4_codes& c, bool v1, bool with_g_idx) {
  require_multiple_of_8(c.out, prefix + " out_features");
  require_multiple_of_8(c.in, prefix + " in_features");
  std::vector<int32_t> qweight((c.in / 8) * c.out), qzeros(c.groups * (c.out / 8));
  for (int64_t w = 0; w < c.in / 8; ++w)
    for (int64_t o = 0; o < c.out; ++o)
      qweight[w * c.out + o] = pack_word([&](int k) { return c.code[o * c.in + 8 * w + k]; });
  for (int64_t g = 0; g < c.groups; ++g) {
    for (int64_t col = 0; col < c.out / 8; ++col) {
      uint32_t word = static_cast<uint32_t>(pack_word([&](int k) { return c.zero[g * c.out + 8 * col + k]; }));
      if (v1) word -= 0b00010001000100010001000100010001u;
      qzeros[g * (c.out / 8) + col] = static_cast<int32_t>(word);
    }
  }
  std::vector<owned_tensor> tensors = {make_tensor(prefix + ".qweight", "I32", {c.in / 8, c.out}, qweight),
                                       make_tensor(prefix + ".qzeros", "I32", {c.groups, c.out / 8}, qzeros),
                                       float_tensor(prefix + ".scales", "F16", {c.groups, c.out}, c.scale)};
  if (with_g_idx) tensors.push_back(make_tensor(prefix + ".g_idx", "I32", {c.in}, c.group));
  return tensors;
}

// compressed-tensors pack-quantized (compressors/pack_quantized, pack_to_int32): signed int4
// values q - 8 are offset by 8 back to unsigned and packed along the last dimension, value k of a
// run of 8 at bits 4k: weight_packed [out, in / 8]. Zero points (asymmetric only: symmetric
// checkpoints omit them) go through pack_to_int32 with packed_dim 0, i.e. along the output
// dimension: weight_zero_point [out / 8, groups]. weight_scale [out, groups] in the model's dtype
// (bf16 here), weight_shape int64 [2], weight_g_idx int32 [in] with actorder "group".
inline std::vector<owned_tensor> pack_compressed_int4(const std::string& prefix, const int4_codes& c, bool symmetric,
                                                      bool with_g_idx) {
  require_multiple_of_8(c.in, prefix + " in_features");
  const int64_t words = c.in / 8;
  std::vector<int32_t> packed(c.out * words);
  for (int64_t o = 0; o < c.out; ++o)
    for (int64_t w = 0; w < words; ++w)
      packed[o * words + w] = pack_word([&](int k) {
        const int signed_value = c.code[o * c.in + 8 * w + k] - 8;  // quantize_weight's int8 result
        return signed_value + 8;                                    // pack_to_int32's offset
      });
  std::vector<float> scale(c.out * c.groups);
  for (int64_t o = 0; o < c.out; ++o)
    for (int64_t g = 0; g < c.groups; ++g) scale[o * c.groups + g] = c.scale[g * c.out + o];
  std::vector<owned_tensor> tensors = {
      make_tensor(prefix + ".weight_packed", "I32", {c.out, words}, packed),
      float_tensor(prefix + ".weight_scale", "BF16", {c.out, c.groups}, scale),
      make_tensor(prefix + ".weight_shape", "I64", {2}, std::vector<int64_t>{c.out, c.in})};
  if (!symmetric) {
    std::vector<int32_t> zero_point(((c.out + 7) / 8) * c.groups);
    for (int64_t w = 0; w < (c.out + 7) / 8; ++w)
      for (int64_t g = 0; g < c.groups; ++g)
        zero_point[w * c.groups + g] = pack_word([&](int k) {
          const int64_t o = 8 * w + k;
          return o < c.out ? (c.zero[g * c.out + o] - 8) + 8 : 0;
        });
    tensors.push_back(make_tensor(prefix + ".weight_zero_point", "I32", {(c.out + 7) / 8, c.groups}, zero_point));
  }
  if (with_g_idx) tensors.push_back(make_tensor(prefix + ".weight_g_idx", "I32", {c.in}, c.group));
  return tensors;
}

// An FP8 layer before writing: value(o, i) = scale of (o, i) * e4m3(code[o, i]).
struct fp8_codes {
  int64_t out = 0, in = 0;
  std::vector<uint8_t> code;               // [out, in], E4M3FN bytes, never NaN
  int64_t block_rows = 0, block_cols = 0;  // one scale per block of [block_rows, block_cols]
  std::vector<float> scale;                // [ceil(out / block_rows), ceil(in / block_cols)]

  float scale_of(int64_t o, int64_t i) const {
    const int64_t scale_cols = (in + block_cols - 1) / block_cols;
    return scale[(o / block_rows) * scale_cols + i / block_cols];
  }
  double value(int64_t o, int64_t i) const {
    return static_cast<double>(scale_of(o, i)) * quant::fp8_e4m3_to_f32(code[o * in + i]);
  }
};

// block_rows = out, block_cols = in: per tensor; block_rows 1, block_cols in: per channel.
inline fp8_codes random_fp8(int64_t out, int64_t in, int64_t block_rows, int64_t block_cols, uint32_t seed) {
  std::mt19937 rng(seed);
  fp8_codes c{out, in, std::vector<uint8_t>(out * in), block_rows, block_cols, {}};
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& q : c.code) {
    do q = static_cast<uint8_t>(byte(rng));
    while ((q & 0x7f) == 0x7f);
  }
  c.scale.resize(((out + block_rows - 1) / block_rows) * ((in + block_cols - 1) / block_cols));
  for (auto& s : c.scale) s = short_scale(rng, -14, -6);
  return c;
}

// quant_method fp8 / compressed-tensors float-quantized: `weight` F8_E4M3 [out, in] and its scale
// named `scale_name` (weight_scale, or weight_scale_inv in block-wise fp8 exports) of `shape`.
inline std::vector<owned_tensor> pack_fp8(const std::string& prefix, const fp8_codes& c, const std::string& scale_name,
                                          const std::string& scale_type, std::vector<int64_t> scale_shape) {
  return {make_tensor(prefix + ".weight", "F8_E4M3", {c.out, c.in}, c.code),
          float_tensor(prefix + "." + scale_name, scale_type, std::move(scale_shape), c.scale)};
}

// x rounded to 7 significant bits (see short_scale).
inline float short_float(float x) {
  int exponent;
  const float fraction = std::frexp(x, &exponent);
  return std::ldexp(std::round(fraction * 128.0f) / 128.0f, exponent);
}

// Quantizes w [out, in] to 4 bits the way GPTQ / AWQ round: per group, asymmetric min-max (or
// symmetric with zero 8); act_order assigns columns to groups in a random order, as desc_act does.
// Scales get 7 significant bits (exact through q4_1's f16 min), or with short_scales false the
// f16 the tools store, whose -zero * scale then rounds in q4_1.
inline int4_codes quantize_int4(const std::vector<float>& w, int64_t out, int64_t in, int64_t group_size,
                                bool act_order, bool symmetric, uint32_t seed, bool short_scales = true) {
  int4_codes c = random_int4(out, in, group_size, act_order, symmetric, seed);  // groups; codes overwritten
  for (int64_t g = 0; g < c.groups; ++g) {
    for (int64_t o = 0; o < out; ++o) {
      float lo = 0, hi = 0;
      for (int64_t i = 0; i < in; ++i) {
        if (c.group[i] != g) continue;
        lo = std::min(lo, w[o * in + i]);
        hi = std::max(hi, w[o * in + i]);
      }
      const float range = symmetric ? std::max(-lo, hi) / 7.5f : (hi - lo) / 15.0f;
      const float scale = short_scales ? short_float(range) : f16_to_f32(f32_to_f16(range));
      const int zero = symmetric ? 8 : std::clamp(static_cast<int>(std::lround(-lo / scale)), 0, 15);
      c.scale[g * out + o] = scale;
      c.zero[g * out + o] = static_cast<uint8_t>(zero);
      for (int64_t i = 0; i < in; ++i) {
        if (c.group[i] != g) continue;
        c.code[o * in + i] =
            static_cast<uint8_t>(std::clamp(static_cast<int>(std::lround(w[o * in + i] / scale)) + zero, 0, 15));
      }
    }
  }
  return c;
}

// FP8 with one scale per [block_rows, block_cols] block: scale = max|w| / 448 of the block.
inline fp8_codes quantize_fp8(const std::vector<float>& w, int64_t out, int64_t in, int64_t block_rows,
                              int64_t block_cols) {
  fp8_codes c = random_fp8(out, in, block_rows, block_cols, 0);
  const int64_t scale_cols = (in + block_cols - 1) / block_cols;
  std::fill(c.scale.begin(), c.scale.end(), 0.0f);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      float& s = c.scale[(o / block_rows) * scale_cols + i / block_cols];
      s = std::max(s, std::fabs(w[o * in + i]));
    }
  for (float& s : c.scale) s = s > 0 ? short_float(s / quant::fp8_e4m3_max) : 1.0f;
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) c.code[o * in + i] = quant::f32_to_fp8_e4m3(w[o * in + i] / c.scale_of(o, i));
  return c;
}

}  // namespace troupe::test
