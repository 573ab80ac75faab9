#include "kernels/cuda/rope_frequencies.hpp"

#include <cmath>
#include <numbers>

namespace troupe::cuda {

std::vector<float> rope_inv_freq(const model_config& config) {
  const int half = config.head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(config.head_dim);
    inv_freq[i] = 1.0f / std::pow(config.rope_theta, exponent);
  }
  if (!config.rope_scaling) return inv_freq;
  // Llama 3.x: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
  const rope_scaling_config& s = *config.rope_scaling;
  const float old_context = static_cast<float>(s.original_max_position_embeddings);
  const float low_freq_wavelen = old_context / s.low_freq_factor;
  const float high_freq_wavelen = old_context / s.high_freq_factor;
  for (float& f : inv_freq) {
    const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
    float scaled = wavelen > low_freq_wavelen ? f / s.factor : f;
    if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)) {
      const float smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      scaled = (1.0f - smooth) * scaled / s.factor + smooth * scaled;
    }
    f = scaled;
  }
  return inv_freq;
}

}  // namespace troupe::cuda
