#include "engine/step_time_model.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

namespace troupe {

void step_shape::add(int num_new, int num_computed) {
  num_tokens += num_new;
  num_sequences += 1;
  const double attended = static_cast<double>(num_computed) + num_new;
  context_tokens += attended;
  attention_pairs += static_cast<double>(num_new) * attended;
}

step_shape shape_of(const step_outline& step) {
  step_shape shape;
  for (const planned_sequence& s : step.sequences) shape.add(s.num_new_tokens, s.num_computed_tokens);
  return shape;
}

step_cost::coefficients step_cost::features(const step_shape& shape) const {
  return {1.0, std::max(shape.num_tokens, token_floor), shape.num_sequences, shape.context_tokens,
          shape.attention_pairs};
}

double step_cost::predict(const step_shape& shape) const {
  const coefficients x = features(shape);
  double t = 0;
  for (size_t j = 0; j < num_features; ++j) t += seconds[j] * x[j];
  return std::max(t, min_seconds);
}

std::string_view step_cost::feature_name(size_t j) {
  static constexpr std::string_view names[num_features] = {"step", "token", "sequence", "context_token",
                                                           "attention_pair"};
  return j < num_features ? names[j] : std::string_view{};
}

double step_time_model::seconds_per_prompt_token() const {
  constexpr int chunk = 256;
  if (num_observed_ < 32) return 0;
  step_shape shape;
  shape.add(chunk, 0);
  return fit_.predict(shape) / chunk;
}

step_time_model::step_time_model(step_cost prior, size_t capacity, double prior_weight)
    : prior_(prior), fit_(prior), capacity_(std::max<size_t>(capacity, 1)), prior_weight_(prior_weight) {}

void step_time_model::observe(const step_shape& shape, double seconds) {
  if (!std::isfinite(seconds) || seconds <= 0) return;
  const auto tokens = static_cast<uint64_t>(std::max(shape.num_tokens, 1.0));
  const size_t size_class = std::min<size_t>(std::bit_width(tokens) - 1, num_size_classes - 1);
  samples_.push_back({shape, seconds, num_observed_, size_class});
  fastest_ = samples_.size() == 1 ? seconds : std::min(fastest_, seconds);
  ++class_counts_[size_class];
  add_to_sums(samples_.back(), +1);
  ++num_observed_;
  while (samples_.size() > capacity_) evict_one();
  // Subtracting evicted steps leaves rounding behind; starting over now and then bounds it.
  if (num_observed_ % capacity_ == 0) recompute_sums();
  refit();
}

void step_time_model::evict_one() {
  // The oldest step goes when it has stayed long enough; otherwise the oldest of the most common
  // size, so the sizes seen least stay in the fit.
  auto victim = samples_.begin();
  if (num_observed_ - victim->seen <= 4 * capacity_) {
    const size_t common =
        static_cast<size_t>(std::max_element(class_counts_.begin(), class_counts_.end()) - class_counts_.begin());
    victim = std::find_if(samples_.begin(), samples_.end(), [&](const sample& s) { return s.size_class == common; });
  }
  add_to_sums(*victim, -1);
  --class_counts_[victim->size_class];
  const bool was_fastest = victim->seconds == fastest_;
  samples_.erase(victim);
  if (was_fastest && !samples_.empty()) {
    fastest_ = std::min_element(samples_.begin(), samples_.end(), [](const sample& a, const sample& b) {
                 return a.seconds < b.seconds;
               })->seconds;
  }
}

void step_time_model::add_to_sums(const sample& s, double sign) {
  for (size_t f = 0; f < num_floors; ++f) {
    // Weighted by 1/seconds²: the fit minimises relative error, so a 600 ms prompt's noise does
    // not outweigh the 3 ms decodes a server mostly runs (in absolute seconds it did: a fit to
    // 1-2,048-token steps missed 1-token decodes by 70 %).
    step_cost::coefficients x = step_cost{{}, floor_of(f)}.features(s.shape);
    for (double& v : x) v /= s.seconds;
    normal_sums& sums = sums_[f];
    for (size_t i = 0; i < step_cost::num_features; ++i) {
      for (size_t j = 0; j < step_cost::num_features; ++j) sums.xx[i][j] += sign * x[i] * x[j];
      sums.xy[i] += sign * x[i];
    }
    sums.yy += sign;
  }
}

void step_time_model::recompute_sums() {
  sums_ = {};
  for (const sample& s : samples_) add_to_sums(s, +1);
}

namespace {

constexpr size_t num_features = step_cost::num_features;

// Solves gram[free, free] z = rhs[free] for the features marked free (z is 0 elsewhere), by
// Gaussian elimination with partial pivoting; false when the system is singular.
bool solve_free(const double (&gram)[num_features][num_features], const double (&rhs)[num_features],
                const std::array<bool, num_features>& free, step_cost::coefficients& z) {
  size_t index[num_features];
  size_t m = 0;
  for (size_t j = 0; j < num_features; ++j) {
    if (free[j]) index[m++] = j;
  }
  double a[num_features][num_features + 1];  // [m, m + 1]
  for (size_t r = 0; r < m; ++r) {
    for (size_t c = 0; c < m; ++c) a[r][c] = gram[index[r]][index[c]];
    a[r][m] = rhs[index[r]];
  }
  for (size_t c = 0; c < m; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < m; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    if (a[pivot][c] == 0) return false;
    for (size_t k = 0; k <= m; ++k) std::swap(a[c][k], a[pivot][k]);
    for (size_t r = c + 1; r < m; ++r) {
      const double factor = a[r][c] / a[c][c];
      for (size_t k = c; k <= m; ++k) a[r][k] -= factor * a[c][k];
    }
  }
  z = {};
  double solved[num_features];  // [m]
  for (size_t c = m; c-- > 0;) {
    double v = a[c][m];
    for (size_t k = c + 1; k < m; ++k) v -= a[c][k] * solved[k];
    solved[c] = v / a[c][c];
  }
  for (size_t r = 0; r < m; ++r) z[index[r]] = solved[r];
  return true;
}

}  // namespace

// Lawson and Hanson's active-set method (Solving Least Squares Problems, 1974, ch. 23) on the
// normal equations: the least squares solution with every coefficient at least zero. A cost is
// never negative; an unconstrained fit over steps whose features move together (stories260K's
// sub-millisecond steps, where the serving stack's share of the cores grows with the load) read
// -1.85 ms a step and -0.27 ms a sequence, and the planner then thought large decode steps free.
bool step_time_model::solve_nonnegative(const double (&gram)[num_features][num_features],
                                        const double (&rhs)[num_features], step_cost::coefficients& beta) {
  std::array<bool, num_features> free{};
  beta = {};
  // Each outer round frees one feature; each inner round bounds at least one back to zero: a
  // handful of rounds for five features (the bound keeps a rounding loop finite).
  for (int round = 0; round < 4 * static_cast<int>(num_features); ++round) {
    // The negative gradient of ½βᵀGβ − rᵀβ at β: where it is positive, raising that cost helps.
    size_t best = num_features;
    double best_gain = 1e-12 * (1 + std::abs(rhs[0]));
    for (size_t j = 0; j < num_features; ++j) {
      if (free[j]) continue;
      double gain = rhs[j];
      for (size_t k = 0; k < num_features; ++k) gain -= gram[j][k] * beta[k];
      if (gain > best_gain) {
        best_gain = gain;
        best = j;
      }
    }
    if (best == num_features) return true;  // no bounded cost wants to rise: optimal
    free[best] = true;
    for (int inner = 0; inner < static_cast<int>(num_features); ++inner) {
      step_cost::coefficients z{};
      if (!solve_free(gram, rhs, free, z)) return false;
      bool all_positive = true;
      for (size_t j = 0; j < num_features; ++j) all_positive = all_positive && (!free[j] || z[j] > 0);
      if (all_positive) {
        beta = z;
        break;
      }
      // Step from β toward z as far as every free cost stays non-negative, and bound those
      // that reach zero.
      double step = 1;
      for (size_t j = 0; j < num_features; ++j) {
        if (free[j] && z[j] <= 0) step = std::min(step, beta[j] / (beta[j] - z[j]));
      }
      for (size_t j = 0; j < num_features; ++j) {
        beta[j] += step * (z[j] - beta[j]);
        if (free[j] && beta[j] <= 1e-15 * (1 + std::abs(z[j]))) {
          free[j] = false;
          beta[j] = 0;
        }
      }
    }
  }
  return true;
}

bool step_time_model::solve(size_t f, step_cost::coefficients& beta, double& residual) const {
  constexpr size_t n = step_cost::num_features;
  const normal_sums& sums = sums_[f];
  double a[n][n + 1];  // [n, n + 1]: the normal equations, right-hand side in the last column
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) a[i][j] = sums.xx[i][j];
    a[i][n] = sums.xy[i];
  }
  // Solved in units of each feature's root mean square, so the constant (one) and the attention
  // pairs (millions) weigh alike and the system stays well conditioned. The prior is pseudo-
  // evidence in those units: prior_weight steps' worth while few are seen, fading as 1/n² after,
  // so it settles directions the steps leave open (a feature that never varied) without biasing
  // the ones they determine. (One prior step fading as 1/n²: four fading as 1/n biased the fit by
  // 5-10 % where features move together, as sequences, context and tokens do; along those
  // directions the steps say little, and the pull toward the prior outweighed it.)
  const double count = static_cast<double>(samples_.size());
  double scale[n];  // [n]
  for (size_t j = 0; j < n; ++j) scale[j] = std::sqrt(std::max(a[j][j] / count, 1e-24));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) a[i][j] /= scale[i] * scale[j];
    a[i][n] /= scale[i];
  }
  // Never less than a thousandth of that: where the steps cannot tell features apart at all (a
  // server that ran one prompt length: tokens and sequences against context and pairs) the
  // prior holds that direction instead of the noise, which had put a negative cost on tokens.
  const double fade = prior_weight_ / (prior_weight_ + count);
  const double ridge = prior_weight_ * std::max(fade * fade, 1e-3);
  for (size_t j = 0; j < n; ++j) {
    a[j][j] += ridge;
    a[j][n] += ridge * prior_.seconds[j] * scale[j];
  }
  double gram[n][n];  // [n, n]
  double rhs[n];      // [n]
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) gram[i][j] = a[i][j];
    rhs[i] = a[i][n];
  }
  if (!solve_nonnegative(gram, rhs, beta)) return false;
  for (size_t j = 0; j < n; ++j) {
    beta[j] /= scale[j];
    if (!std::isfinite(beta[j])) return false;
  }
  // The residual sum of squares from the sums alone: yᵀy - 2 βᵀXᵀy + βᵀXᵀXβ.
  residual = sums.yy;
  for (size_t i = 0; i < n; ++i) {
    residual -= 2 * beta[i] * sums.xy[i];
    for (size_t j = 0; j < n; ++j) residual += beta[i] * sums.xx[i][j] * beta[j];
  }
  residual = std::max(residual, 0.0);
  return true;
}

void step_time_model::refit() {
  // A larger floor must leave clearly less residual to be chosen: with few or exact steps every
  // floor below the smallest step fits alike, and the smallest keeps the model a plain line.
  bool found = false;
  double best_residual = 0;
  for (size_t f = 0; f < num_floors; ++f) {
    step_cost::coefficients beta{};
    double residual = 0;
    if (!solve(f, beta, residual)) continue;
    if (!found || residual < best_residual * (1 - 1e-6)) {
      found = true;
      best_residual = residual;
      fit_ = step_cost{beta, floor_of(f), fastest_};
    }
  }
}

double step_time_model::rms_error() const {
  // Computed when asked (a stats query), not on every step: it walks every step held.
  if (samples_.empty()) return 0;
  double sum_sq = 0;
  for (const sample& s : samples_) {
    const double error = s.seconds - fit_.predict(s.shape);
    sum_sq += error * error;
  }
  return std::sqrt(sum_sq / static_cast<double>(samples_.size()));
}

}  // namespace troupe
