#include "backends/cpu/rope.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::cpu {

void apply_rope(thread_pool& pool, float* q, int64_t ldq, int num_heads, float* k, int64_t ldk, int num_kv_heads,
                int64_t num_tokens, int head_dim, const int32_t* positions, const rope_parameters& rope) {
  const int half = static_cast<int>(rope.inv_freq.size());
  if (2 * half > head_dim) {
    throw std::runtime_error("RoPE over " + std::to_string(2 * half) + " dimensions exceeds head_dim " +
                             std::to_string(head_dim));
  }
  const float* inv_freq = rope.inv_freq.data();
  const float scale = rope.attention_factor;
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
        table[i] = std::cos(angle) * scale;
        table[half + i] = std::sin(angle) * scale;
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
