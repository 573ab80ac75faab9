#pragma once
// Predicts how long a step takes from its shape, fitted online from the steps measured on this
// instance. The SLO policy asks it how long a prefill would take and how large a chunk keeps the
// running decodes within their TPOT targets; early rejection asks it whether a request can still
// meet its TTFT target; `troupe plan` runs its simulated instances on it; /metrics shows its
// coefficients and how well they fit.
//
// The cost is linear in five features: a constant (launch and sampling overhead), the step's new
// tokens but never fewer than a floor (the matmuls: a step reads every weight once however few
// tokens it has, so below the floor the weights' read sets the time, above it the tokens'
// arithmetic), its sequences (per-sequence bookkeeping and sampling), the context its sequences
// read (the sum of their computed + new tokens: each reads its KV once per layer, which is what a
// decode's attention costs) and its attention pairs (the sum of new tokens x tokens attended: a
// prompt chunk's attention arithmetic). A single line through every step cannot serve both ends:
// fitted over 1-token decodes and 1,000-token prefills alike it gave a 10 ms constant where a
// decode takes 3 ms.
//
// The fit is ridge least squares of the relative error (each step weighted by 1/seconds², so the
// few long prompts do not drown the many short decodes) over the steps held, every cost held at
// zero or more (Lawson-Hanson: a cost is never negative, and a negative one made other shapes'
// steps free), pulled toward a prior that holds alone until steps are seen and fades as they come
// (worth `prior_weight` steps at first, less as 1/n² after, never below a thousandth), so a
// feature that never varied (no prefill seen yet) keeps its prior coefficient instead of an
// arbitrary one. The floor is chosen among powers of two by the residual each one leaves.
//
// Memory is bounded: past `capacity` steps the oldest step of the most common size (by powers of
// two of its tokens) goes, so a run of large steps does not push every small one out and the fit
// still knows both ends; no step stays longer than four capacities, so the fit follows a machine
// that changes.
//
// Plain class, not thread-safe: the scheduler that owns it runs on one thread.

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string_view>

#include "engine/step_plan.hpp"

namespace troupe {

struct step_shape {
  double num_tokens = 0;       // new tokens of the step (prefill chunks + decodes)
  double num_sequences = 0;    // sequences in it
  double context_tokens = 0;   // sum over sequences of computed + new tokens: the KV each one reads
  double attention_pairs = 0;  // sum over sequences of new tokens x (computed + new) tokens

  // Adds one sequence computing `num_new` tokens after `num_computed` already in the cache.
  void add(int num_new, int num_computed);
};

// The shape of a planned (or finished) step.
step_shape shape_of(const step_outline& step);

// What a step of a given shape costs: the model's fit, or what `troupe plan` is given.
struct step_cost {
  static constexpr size_t num_features = 5;
  using coefficients = std::array<double, num_features>;

  coefficients seconds{};  // per: step, token, sequence, context token, attention pair
  double token_floor = 1;  // the token feature is max(new tokens, this)
  // No step is predicted faster than this: the fastest step measured. A fit over few steps, or
  // over steps of one shape, can put negative costs on features that move together, and a step
  // of another shape would come out free: a planned decode took no time, a 0.01 ms TTFT target
  // looked attainable.
  double min_seconds = 0;

  // The predicted duration of a step of this shape, in seconds (never below zero).
  double predict(const step_shape& shape) const;
  // The features' names, as /metrics labels them: step, token, sequence, context_token, attention_pair.
  static std::string_view feature_name(size_t j);
  // The features of a shape under this floor.
  coefficients features(const step_shape& shape) const;
};

class step_time_model {
 public:
  // A CPU-sized guess (a few ms per step, tens of µs per token) until steps are measured.
  static constexpr step_cost default_prior{{2e-3, 5e-5, 1e-4, 2e-7, 1e-8}, 1};

  explicit step_time_model(step_cost prior = default_prior, size_t capacity = 512, double prior_weight = 1.0);

  // A step of this shape took `seconds`. A non-positive or non-finite time is ignored.
  void observe(const step_shape& shape, double seconds);
  // The predicted duration of a step of this shape, in seconds (never below zero).
  double predict(const step_shape& shape) const { return fit_.predict(shape); }

  const step_cost& fitted() const { return fit_; }
  // What one token of a 256-token prompt chunk costs, by the fit; 0 until 32 steps are measured
  // (before that the prior speaks, not this machine). The router compares instances by it.
  double seconds_per_prompt_token() const;
  // Steps measured in all, and those the fit holds now (at most the capacity).
  size_t num_observed() const { return num_observed_; }
  size_t num_samples() const { return samples_.size(); }
  // Root mean square of (measured - predicted) over the samples held, in seconds; 0 with none.
  double rms_error() const;

 private:
  static constexpr size_t num_floors = 9;  // 1, 2, 4, ... 256 tokens
  static constexpr size_t num_size_classes = 24;
  struct sample {
    step_shape shape;
    double seconds = 0;
    uint64_t seen = 0;  // num_observed_ when it came
    size_t size_class = 0;
  };
  // The normal equations of one floor's weighted least squares over the samples held: XᵀWX, XᵀWy
  // and yᵀWy with W = diag(1/seconds²).
  struct normal_sums {
    double xx[step_cost::num_features][step_cost::num_features] = {};
    double xy[step_cost::num_features] = {};
    double yy = 0;
  };

  static double floor_of(size_t f) { return static_cast<double>(uint64_t{1} << f); }
  void add_to_sums(const sample& s, double sign);
  void recompute_sums();
  void evict_one();
  // The ridge solution for one floor, every cost at least zero, and the weighted squared
  // residual it leaves; false if it is not finite.
  bool solve(size_t f, step_cost::coefficients& beta, double& residual) const;
  // The minimum of ½βᵀGβ − rᵀβ over β ≥ 0 (G positive definite: the ridge keeps it so).
  static bool solve_nonnegative(const double (&gram)[step_cost::num_features][step_cost::num_features],
                                const double (&rhs)[step_cost::num_features], step_cost::coefficients& beta);
  void refit();

  step_cost prior_;
  step_cost fit_;
  size_t capacity_;
  double prior_weight_;
  std::deque<sample> samples_;  // oldest first
  std::array<size_t, num_size_classes> class_counts_{};
  std::array<normal_sums, num_floors> sums_{};
  size_t num_observed_ = 0;
  double fastest_ = 0;  // the fastest step held; 0 with none
};

}  // namespace troupe
