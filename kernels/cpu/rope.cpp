#include "kernels/cpu/rope.hpp"

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace troupe::cpu {

std::vector<float> rope_inv_freq(const model_config& config) {
  const int head_dim = config.head_dim;
  if (head_dim <= 0 || head_dim % 2 != 0) {
    throw std::runtime_error("RoPE needs an even head_dim, got " + std::to_string(head_dim));
  }
  std::vector<float> inv_freq(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    // As HF computes it: the exponent and the power in float32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[i] = 1.0f / std::pow(config.rope_theta, exponent);
  }
  if (config.rope_scaling) {
    const rope_scaling_config& s = *config.rope_scaling;
    const float original = static_cast<float>(s.original_max_position_embeddings);
    const float low_freq_wavelen = original / s.low_freq_factor;
    const float high_freq_wavelen = original / s.high_freq_factor;
    for (float& freq : inv_freq) {
      const float wavelen = 2.0f * std::numbers::pi_v<float> / freq;
      if (wavelen < high_freq_wavelen) continue;
      if (wavelen > low_freq_wavelen) {
        freq = freq / s.factor;
      } else {
        const float smooth = (original / wavelen - s.low_freq_factor) /
                             (s.high_freq_factor - s.low_freq_factor);
        freq = (1.0f - smooth) * freq / s.factor + smooth * freq;
      }
    }
  }
  return inv_freq;
}

void apply_rope(thread_pool& pool, float* q, int64_t ldq, int num_heads, float* k, int64_t ldk,
                int num_kv_heads, int64_t num_tokens, int head_dim, const int32_t* positions,
                const std::vector<float>& inv_freq) {
  const int half = head_dim / 2;
  pool.parallel_for(0, num_tokens, 16, [&](int64_t begin, int64_t end, int) {
    float cos_sin[2 * 512];
    std::vector<float> large;
    float* table = cos_sin;
    if (half > 512) {
      large.resize(2 * half);
      table = large.data();
    }
    for (int64_t t = begin; t < end; ++t) {
      const float position = static_cast<float>(positions[t]);
      for (int i = 0; i < half; ++i) {
        const float angle = position * inv_freq[i];
        table[i] = std::cos(angle);
        table[half + i] = std::sin(angle);
      }
      auto rotate = [&](float* head) {
        for (int i = 0; i < half; ++i) {
          const float x1 = head[i];
          const float x2 = head[half + i];
          head[i] = x1 * table[i] - x2 * table[half + i];
          head[half + i] = x2 * table[i] + x1 * table[half + i];
        }
      };
      for (int h = 0; h < num_heads; ++h) rotate(q + t * ldq + h * head_dim);
      for (int h = 0; h < num_kv_heads; ++h) rotate(k + t * ldk + h * head_dim);
    }
  });
}

}  // namespace troupe::cpu
