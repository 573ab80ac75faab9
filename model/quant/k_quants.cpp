// Reference dequantization of the k-quants. Each computes a value with the same float operations
// in the same order as ggml's reference code, so the two agree bit for bit (the tests check it
// against llama.cpp's own library).

#include "model/quant/k_quants.hpp"

#include "model/quant/block_fields.hpp"

namespace troupe::quant {

// Q2_K. Element e lives in sub-block e / 16. Within each half of 128 elements, byte l of that
// half's 32 bytes of qs holds four 2-bit values: bits 2s..2s+1 belong to element 32 s + l.
void dequantize_q2_k(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / k_block_size; ++b) {
    const std::byte* block = blocks + b * 84;
    const uint8_t* scales = bytes_at(block);
    const uint8_t* qs = bytes_at(block + 16);
    const float d = read_f16(block + 80);
    const float dmin = read_f16(block + 82);
    float* y = out + b * k_block_size;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* q = qs + 32 * half;
      for (int s = 0; s < 4; ++s) {
        for (int part = 0; part < 2; ++part) {
          const uint8_t sc = scales[8 * half + 2 * s + part];
          const float dl = d * static_cast<float>(sc & 0x0f);
          const float ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) {
            const int value = (q[16 * part + l] >> (2 * s)) & 3;
            *y++ = dl * static_cast<float>(value) - ml;
          }
        }
      }
    }
  }
}

// Q3_K. Element e of half h (e = 128 h + 32 s + l, l < 32): low 2 bits at bits 2s of byte
// 32 h + l of qs, high bit at bit 4 h + s of hmask[l]; a clear high bit subtracts 4.
void dequantize_q3_k(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / k_block_size; ++b) {
    const std::byte* block = blocks + b * 110;
    const uint8_t* hmask = bytes_at(block);
    const uint8_t* qs = bytes_at(block + 32);
    int8_t scales[16];
    q3_k_scales(bytes_at(block + 96), scales);
    const float d = read_f16(block + 108);
    float* y = out + b * k_block_size;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* q = qs + 32 * half;
      for (int s = 0; s < 4; ++s) {
        const uint8_t high_bit = static_cast<uint8_t>(1u << (4 * half + s));
        for (int part = 0; part < 2; ++part) {
          const float dl = d * static_cast<float>(scales[8 * half + 2 * s + part]);
          for (int l = 16 * part; l < 16 * part + 16; ++l) {
            const int value = ((q[l] >> (2 * s)) & 3) - ((hmask[l] & high_bit) ? 0 : 4);
            *y++ = dl * static_cast<float>(value);
          }
        }
      }
    }
  }
}

// Q4_K. Each 64 elements use 32 bytes of qs: their low nibbles are the first 32 elements
// (sub-block 2i), their high nibbles the next 32 (sub-block 2i + 1).
void dequantize_q4_k(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / k_block_size; ++b) {
    const std::byte* block = blocks + b * 144;
    const float d = read_f16(block);
    const float dmin = read_f16(block + 2);
    const uint8_t* packed = bytes_at(block + 4);
    const uint8_t* q = bytes_at(block + 16);
    float* y = out + b * k_block_size;
    for (int pair = 0; pair < 4; ++pair) {
      uint8_t sc, m;
      k_scale_min(2 * pair, packed, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      k_scale_min(2 * pair + 1, packed, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
    }
  }
}

// Q5_K: Q4_K's layout, plus a 5th bit: element 64 i + l (l < 32) takes bit 2i of qh[l], element
// 64 i + 32 + l bit 2i + 1.
void dequantize_q5_k(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / k_block_size; ++b) {
    const std::byte* block = blocks + b * 176;
    const float d = read_f16(block);
    const float dmin = read_f16(block + 2);
    const uint8_t* packed = bytes_at(block + 4);
    const uint8_t* qh = bytes_at(block + 16);
    const uint8_t* ql = bytes_at(block + 48);
    float* y = out + b * k_block_size;
    for (int pair = 0; pair < 4; ++pair) {
      uint8_t sc, m;
      k_scale_min(2 * pair, packed, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      k_scale_min(2 * pair + 1, packed, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      const uint8_t bit1 = static_cast<uint8_t>(1u << (2 * pair));
      const uint8_t bit2 = static_cast<uint8_t>(2u << (2 * pair));
      for (int l = 0; l < 32; ++l) {
        *y++ = d1 * static_cast<float>((ql[l] & 0x0f) + ((qh[l] & bit1) ? 16 : 0)) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & bit2) ? 16 : 0)) - m2;
      }
      ql += 32;
    }
  }
}

// Q6_K. Each half of 128 elements uses 64 bytes of ql, 32 of qh and 8 scales. For l < 32, byte
// l of ql (low nibble / high nibble) and byte l + 32 (low / high) give elements l, l + 64, and
// l + 32, l + 96; the matching 2-bit pairs of qh[l] are bits 0-1, 4-5, 2-3, 6-7.
void dequantize_q6_k(const std::byte* blocks, float* out, int64_t count) {
  for (int64_t b = 0; b < count / k_block_size; ++b) {
    const std::byte* block = blocks + b * 210;
    const uint8_t* ql = bytes_at(block);
    const uint8_t* qh = bytes_at(block + 128);
    const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
    const float d = read_f16(block + 208);
    float* y = out + b * k_block_size;
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

}  // namespace troupe::quant
