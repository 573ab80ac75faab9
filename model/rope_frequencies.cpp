#include "model/rope_frequencies.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

#include "model/architecture.hpp"

namespace troupe {
namespace {

// As transformers computes the unscaled frequencies: the exponent and the power in float32.
std::vector<float> default_inv_freq(float theta, int dims) {
  std::vector<float> inv_freq(dims / 2);
  for (int i = 0; i < dims / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dims);
    inv_freq[i] = 1.0f / std::pow(theta, exponent);
  }
  return inv_freq;
}

void apply_llama3(const rope_scaling_config& s, int original, std::vector<float>& inv_freq) {
  const float low_freq_wavelen = static_cast<float>(original) / s.low_freq_factor;
  const float high_freq_wavelen = static_cast<float>(original) / s.high_freq_factor;
  for (float& freq : inv_freq) {
    const float wavelen = 2.0f * std::numbers::pi_v<float> / freq;
    if (wavelen < high_freq_wavelen) continue;
    if (wavelen > low_freq_wavelen) {
      freq = freq / s.factor;
    } else {
      const float smooth =
          (static_cast<float>(original) / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      freq = (1.0f - smooth) * freq / s.factor + smooth * freq;
    }
  }
}

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// The dimension (of `dims`) whose wavelength fits `rotations` turns into the original context.
double yarn_correction_dim(double rotations, int dims, double theta, int original) {
  return dims * std::log(original / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
}

float apply_yarn(const rope_scaling_config& s, float theta, int dims, int original, std::vector<float>& inv_freq) {
  double low = yarn_correction_dim(s.beta_fast, dims, theta, original);
  double high = yarn_correction_dim(s.beta_slow, dims, theta, original);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dims - 1));
  if (low == high) high += 0.001;  // as transformers: no division by zero
  for (int i = 0; i < dims / 2; ++i) {
    const double extrapolated = std::pow(static_cast<double>(theta), -2.0 * i / dims);
    const double interpolated = extrapolated / s.factor;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;  // 1: the frequency is kept (extrapolated), 0: divided by factor
    inv_freq[i] = static_cast<float>(interpolated * (1 - keep) + extrapolated * keep);
  }
  if (s.attention_factor > 0) return s.attention_factor;
  if (s.mscale > 0 && s.mscale_all_dim > 0) {
    return static_cast<float>(yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim));
  }
  return static_cast<float>(yarn_mscale(s.factor, 1.0));
}

}  // namespace

float longrope_attention_factor(int max_position_embeddings, int original_max_position_embeddings) {
  if (original_max_position_embeddings <= 0) return 1.0f;
  const double scale = static_cast<double>(max_position_embeddings) / original_max_position_embeddings;
  if (scale <= 1.0) return 1.0f;
  return static_cast<float>(
      std::sqrt(1 + std::log(scale) / std::log(static_cast<double>(original_max_position_embeddings))));
}

float dynamic_ntk_base(const model_config& config) {
  const int dims = rotary_dims(config);
  const double factor = config.rope_scaling ? config.rope_scaling->factor : 1.0;
  if (dims <= 2) return config.rope_theta;
  return static_cast<float>(config.rope_theta *
                            std::pow(factor * factor - (factor - 1), static_cast<double>(dims) / (dims - 2)));
}

rope_parameters rope_for_layer(const model_config& config, int layer) {
  const int dims = rotary_dims(config);
  if (dims <= 0 || dims % 2 != 0 || dims > config.head_dim) {
    throw std::runtime_error("RoPE needs an even rotary dimension of at most head_dim " +
                             std::to_string(config.head_dim) + ", got " + std::to_string(dims));
  }
  const bool local = config.rope_local_theta > 0 && layer >= 0 &&
                     layer < static_cast<int>(config.sliding_layers.size()) && config.sliding_layers[layer];
  rope_parameters result;
  if (local) {  // Gemma 3: sliding layers keep their own base and no scaling
    result.inv_freq = default_inv_freq(config.rope_local_theta, dims);
    return result;
  }
  float theta = config.rope_theta;
  if (!config.rope_scaling) {
    result.inv_freq = default_inv_freq(theta, dims);
    return result;
  }
  const rope_scaling_config& s = *config.rope_scaling;
  const int original =
      s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings : config.max_position_embeddings;
  switch (s.type) {
    case rope_scaling_type::linear:
      result.inv_freq = default_inv_freq(theta, dims);
      for (float& f : result.inv_freq) f /= s.factor;
      break;
    case rope_scaling_type::dynamic: result.inv_freq = default_inv_freq(dynamic_ntk_base(config), dims); break;
    case rope_scaling_type::llama3:
      result.inv_freq = default_inv_freq(theta, dims);
      apply_llama3(s, original, result.inv_freq);
      break;
    case rope_scaling_type::yarn:
      result.inv_freq.resize(dims / 2);
      result.attention_factor = apply_yarn(s, theta, dims, original, result.inv_freq);
      break;
    case rope_scaling_type::longrope: {
      const bool long_context = config.max_position_embeddings > original;
      const std::vector<float>& divisors = long_context ? s.long_factor : s.short_factor;
      if (static_cast<int>(divisors.size()) != dims / 2) {
        throw std::runtime_error(std::string("longrope ") + (long_context ? "long_factor" : "short_factor") + " has " +
                                 std::to_string(divisors.size()) +
                                 " values, expected rotary dimensions / 2 = " + std::to_string(dims / 2));
      }
      result.inv_freq.resize(dims / 2);
      for (int i = 0; i < dims / 2; ++i) {
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(dims);
        result.inv_freq[i] = 1.0f / (divisors[i] * std::pow(theta, exponent));
      }
      result.attention_factor = s.attention_factor > 0 ? s.attention_factor : 1.0f;
      break;
    }
  }
  return result;
}

std::vector<float> rope_inv_freq(const model_config& config) {
  // A layer index past the sliding table is a full-attention layer.
  return rope_for_layer(config, -1).inv_freq;
}

}  // namespace troupe
