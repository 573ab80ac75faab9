#pragma once
// Predicts how long a step takes from its shape, fitted online from the steps measured on this
// instance. The SLO policy asks it how long a prefill would take and how large a chunk keeps the
// running decodes within their TPOT targets; early rejection asks it whether a request can still
// meet its TTFT target; /metrics shows its coefficients and how well they fit.
//
// The model is linear in four features: a constant (launch and sampling overhead), the step's
// new tokens (the matmuls), its sequences (per-sequence bookkeeping and sampling), and its
// attention pairs, the sum over sequences of new tokens x tokens attended (the attention's
// work: a decode's context, or a prompt chunk's triangle). Ridge least squares over the last
// `capacity` steps (bounded memory), pulled toward a prior that holds alone until steps are seen
// and fades as they come (worth `prior_weight` steps at first, less as 1/n after), so a feature
// that never varied (no prefill seen yet) keeps its prior coefficient instead of an arbitrary one.
//
// Plain class, not thread-safe: the scheduler that owns it runs on one thread.

#include <array>
#include <cstddef>
#include <deque>

#include "engine/step_plan.hpp"

namespace troupe {

struct step_shape {
  double num_tokens = 0;       // new tokens of the step (prefill chunks + decodes)
  double num_sequences = 0;    // sequences in it
  double attention_pairs = 0;  // sum over sequences of new tokens x (computed + new) tokens

  // Adds one sequence computing `num_new` tokens after `num_computed` already in the cache.
  void add(int num_new, int num_computed);
};

// The shape of a planned (or finished) step.
step_shape shape_of(const step_outline& step);

class step_time_model {
 public:
  static constexpr size_t num_features = 4;
  using coefficients = std::array<double, num_features>;  // seconds per: 1, token, sequence, pair

  // A CPU-sized guess (a few ms per step, tens of µs per token) until steps are measured.
  static constexpr coefficients default_prior{2e-3, 5e-5, 1e-4, 1e-8};

  explicit step_time_model(coefficients prior = default_prior, size_t capacity = 512, double prior_weight = 4.0);

  // A step of this shape took `seconds`. A non-positive or non-finite time is ignored.
  void observe(const step_shape& shape, double seconds);
  // The predicted duration of a step of this shape, in seconds (never below zero).
  double predict(const step_shape& shape) const;

  const coefficients& fitted() const { return beta_; }
  // Steps measured in all, and those the fit holds now (at most the capacity).
  size_t num_observed() const { return num_observed_; }
  size_t num_samples() const { return samples_.size(); }
  // Root mean square of (measured - predicted) over the samples held, in seconds; 0 with none.
  double rms_error() const { return rms_error_; }

 private:
  struct sample {
    coefficients x;  // the features
    double seconds;
  };
  static coefficients features(const step_shape& shape);
  void refit();

  coefficients prior_;
  coefficients beta_;
  size_t capacity_;
  double prior_weight_;
  std::deque<sample> samples_;
  size_t num_observed_ = 0;
  double rms_error_ = 0;
};

}  // namespace troupe
