#include "engine/step_time_model.hpp"

#include <algorithm>
#include <cmath>

namespace troupe {

void step_shape::add(int num_new, int num_computed) {
  num_tokens += num_new;
  num_sequences += 1;
  attention_pairs += static_cast<double>(num_new) * (static_cast<double>(num_computed) + num_new);
}

step_shape shape_of(const step_outline& step) {
  step_shape shape;
  for (const planned_sequence& s : step.sequences) shape.add(s.num_new_tokens, s.num_computed_tokens);
  return shape;
}

step_time_model::step_time_model(coefficients prior, size_t capacity, double prior_weight)
    : prior_(prior), beta_(prior), capacity_(std::max<size_t>(capacity, 1)), prior_weight_(prior_weight) {}

step_time_model::coefficients step_time_model::features(const step_shape& shape) {
  return {1.0, shape.num_tokens, shape.num_sequences, shape.attention_pairs};
}

void step_time_model::observe(const step_shape& shape, double seconds) {
  if (!std::isfinite(seconds) || seconds <= 0) return;
  samples_.push_back({features(shape), seconds});
  while (samples_.size() > capacity_) samples_.pop_front();
  ++num_observed_;
  refit();
}

double step_time_model::predict(const step_shape& shape) const {
  const coefficients x = features(shape);
  double t = 0;
  for (size_t j = 0; j < num_features; ++j) t += beta_[j] * x[j];
  return std::max(t, 0.0);
}

void step_time_model::refit() {
  constexpr size_t n = num_features;
  double a[n][n + 1] = {};  // [n, n + 1]: the normal equations, right-hand side in the last column
  for (const sample& s : samples_) {
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) a[i][j] += s.x[i] * s.x[j];
      a[i][n] += s.x[i] * s.seconds;
    }
  }
  // Solved in units of each feature's root mean square, so the constant (one) and the attention
  // pairs (millions) weigh alike and the system stays well conditioned. The prior is pseudo-
  // evidence in those units: prior_weight steps' worth while few are seen, fading as 1/n, so it
  // settles directions the steps leave open (a feature that never varied) without biasing the
  // ones they determine.
  const double count = static_cast<double>(samples_.size());
  double scale[n];  // [n]
  for (size_t j = 0; j < n; ++j) scale[j] = std::sqrt(std::max(a[j][j] / count, 1e-24));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) a[i][j] /= scale[i] * scale[j];
    a[i][n] /= scale[i];
  }
  const double ridge = prior_weight_ * prior_weight_ / (prior_weight_ + count);
  for (size_t j = 0; j < n; ++j) {
    a[j][j] += ridge;
    a[j][n] += ridge * prior_[j] * scale[j];
  }
  // Gaussian elimination with partial pivoting; the ridge term keeps the matrix positive definite.
  for (size_t c = 0; c < n; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    if (a[pivot][c] == 0) return;  // cannot happen with the ridge term; keep the last fit
    for (size_t k = 0; k <= n; ++k) std::swap(a[c][k], a[pivot][k]);
    for (size_t r = c + 1; r < n; ++r) {
      const double f = a[r][c] / a[c][c];
      for (size_t k = c; k <= n; ++k) a[r][k] -= f * a[c][k];
    }
  }
  coefficients beta{};
  for (size_t c = n; c-- > 0;) {
    double v = a[c][n];
    for (size_t k = c + 1; k < n; ++k) v -= a[c][k] * beta[k];
    beta[c] = v / a[c][c];
  }
  for (size_t j = 0; j < n; ++j) beta[j] /= scale[j];
  for (double b : beta) {
    if (!std::isfinite(b)) return;
  }
  beta_ = beta;
  double sum_sq = 0;
  for (const sample& s : samples_) {
    double t = 0;
    for (size_t j = 0; j < n; ++j) t += beta_[j] * s.x[j];
    sum_sq += (s.seconds - t) * (s.seconds - t);
  }
  rms_error_ = std::sqrt(sum_sq / count);
}

}  // namespace troupe
