#include "engine/slo_policy.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace troupe {

namespace {
double seconds_between(engine_clock::time_point from, engine_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// What a sequence still has to prefill before its first (next) sample.
int remaining_prefill(const sequence& seq) { return std::max(seq.num_tokens() - seq.num_computed_tokens(), 0); }
}  // namespace

double slo_policy::prefill_seconds(int num_tokens, int num_computed) const {
  double total = 0;
  const int budget = config_.max_num_batched_tokens;
  for (int done = 0; done < num_tokens; done += budget) {
    step_shape shape;
    shape.add(std::min(budget, num_tokens - done), num_computed + done);
    total += step_times_.predict(shape);
  }
  return total;
}

double slo_policy::service_seconds(const sequence& seq) const {
  return prefill_seconds(remaining_prefill(seq), seq.num_computed_tokens());
}

double slo_policy::full_step_seconds() const {
  step_shape shape;
  shape.add(config_.max_num_batched_tokens, 0);
  return step_times_.predict(shape);
}

double slo_policy::slack_seconds(const sequence& seq) const {
  const double waited = seconds_between(seq.timeline().arrival, now_);
  return seq.targets().ttft_ms / 1000.0 - waited - service_seconds(seq);
}

sequence* slo_policy::next_waiting(const std::vector<sequence*>& waiting) const {
  const double step_s = full_step_seconds();
  // Due: has a TTFT target, can still meet it, and only if it starts now.
  sequence* due = nullptr;
  double due_deadline = 0;
  sequence* best = nullptr;
  double best_ratio = -1;
  for (sequence* seq : waiting) {
    // A request that produced tokens already (preempted) is past its TTFT: HRRN alone.
    if (seq->targets().ttft_ms > 0 && seq->num_output_tokens() == seq->num_resumed_output_tokens()) {
      const double slack = slack_seconds(*seq);
      const double deadline = seq->targets().ttft_ms / 1000.0 - seconds_between(seq->timeline().arrival, now_);
      if (slack >= 0 && slack < step_s && (due == nullptr || deadline < due_deadline)) {
        due = seq;
        due_deadline = deadline;
      }
    }
    const double service = std::max(service_seconds(*seq), 1e-9);
    const double ratio = (std::max(seconds_between(seq->timeline().arrival, now_), 0.0) + service) / service;
    if (best == nullptr || ratio > best_ratio ||
        (ratio == best_ratio && seq->arrival_order() < best->arrival_order())) {
      best = seq;
      best_ratio = ratio;
    }
  }
  return due != nullptr ? due : best;
}

int slo_policy::prefill_token_cap(const step_shape& decodes, double tightest_tpot_s) const {
  if (tightest_tpot_s <= 0) return std::numeric_limits<int>::max();
  auto fits = [&](int num_prefill) {
    step_shape shape = decodes;
    shape.add(num_prefill, 0);
    return step_times_.predict(shape) <= tightest_tpot_s;
  };
  // The predicted time grows with the tokens: the largest count that fits, by bisection.
  int lo = 0;
  int hi = config_.max_num_batched_tokens;
  if (fits(hi)) return hi;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return std::max(lo, config_.block_size);
}

std::optional<std::string> slo_policy::refusal(const sequence& seq, const std::vector<sequence*>& waiting,
                                               const std::vector<sequence*>& running,
                                               engine_clock::time_point now) const {
  if (seq.targets().ttft_ms <= 0) return {};
  // Everything queued now is prefilled before it or alongside it, a budget per step, while the
  // running decodes ride in every step. HRRN may let it pass some of them; counting them all
  // makes the refusal err towards admitting only what surely fits.
  int64_t ahead = 0;
  step_shape decodes;
  for (const sequence* s : running) {
    const int left = remaining_prefill(*s);
    if (left > 0) {
      ahead += left;
    } else {
      decodes.add(1, s->num_tokens());
    }
  }
  for (const sequence* s : waiting) ahead += remaining_prefill(*s);
  const int64_t total = ahead + remaining_prefill(seq);
  const int budget =
      std::max(config_.max_num_batched_tokens - static_cast<int>(decodes.num_tokens), config_.block_size);
  const int64_t num_steps = (total + budget - 1) / budget;
  step_shape step = decodes;
  step.add(static_cast<int>(std::min<int64_t>(budget, total)), 0);
  const double predicted_s = static_cast<double>(num_steps) * step_times_.predict(step) +
                             std::max(seconds_between(seq.timeline().arrival, now), 0.0);
  const double target_s = seq.targets().ttft_ms / 1000.0;
  if (predicted_s <= target_s) return {};
  return "request " + std::to_string(seq.request_id()) + ": its TTFT target of " +
         std::to_string(static_cast<int64_t>(std::lround(seq.targets().ttft_ms))) +
         " ms cannot be met: " + std::to_string(ahead) + " prompt tokens are queued ahead of it, about " +
         std::to_string(static_cast<int64_t>(std::lround(predicted_s * 1000))) +
         " ms to its first token at the predicted step times";
}

}  // namespace troupe
