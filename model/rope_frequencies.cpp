#include "model/rope_frequencies.hpp"

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace troupe {

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

}  // namespace troupe
