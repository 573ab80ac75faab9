#pragma once
// Serves for latency targets, with the step-time model's predictions.
//
// Admission: highest response ratio next, (waited + service) / service, where service is the
// predicted time to prefill what the request still needs. Short prompts go first (a chat does not
// wait behind a long document), and a long prompt's ratio grows while it waits, so nothing
// starves. A request that can still meet its TTFT target only if it starts within one full step
// is due: due requests go before the others, earliest deadline first.
//
// Chunk sizing: a step carries at most as many prefill tokens as keep its predicted duration
// within the tightest TPOT target of the decodes riding in it (never less than one block, so
// prompts always progress).
//
// Early rejection (engine_config::slo_admission "reject"): refusal() tells a request whose TTFT
// target cannot be met given the prefill queued ahead of it and the predicted step times.

#include <optional>
#include <string>
#include <vector>

#include "engine/scheduling_policy.hpp"

namespace troupe {

class slo_policy : public scheduling_policy {
 public:
  slo_policy(const engine_config& config, const step_time_model& step_times)
      : config_(config), step_times_(step_times) {}  // copies the config, keeps a reference to the model

  bool runs_before(const sequence& a, const sequence& b) const override {
    return a.arrival_order() < b.arrival_order();
  }
  sequence* next_waiting(const std::vector<sequence*>& waiting) const override;
  int prefill_token_cap(const step_shape& decodes, double tightest_tpot_s) const override;

  // The predicted seconds to prefill what `seq` still needs, chunk by chunk at the full budget.
  double service_seconds(const sequence& seq) const;
  // Seconds `seq` may still wait before starting and meet its TTFT target (negative: it cannot).
  // Only for a request with a TTFT target.
  double slack_seconds(const sequence& seq) const;
  // The predicted duration of one step that spends the whole token budget on prefill.
  double full_step_seconds() const;
  // Why `seq` (not yet queued, with a TTFT target) cannot meet its target behind the prefill of
  // `waiting` and `running`, or nothing when it can, or has no target. `now` is when it is decided.
  std::optional<std::string> refusal(const sequence& seq, const std::vector<sequence*>& waiting,
                                     const std::vector<sequence*>& running,
                                     engine_clock::time_point now) const override;

 private:
  // Predicted seconds to prefill `num_tokens` after `num_computed`, in budget-sized chunks.
  double prefill_seconds(int num_tokens, int num_computed) const;

  engine_config config_;
  const step_time_model& step_times_;
};

}  // namespace troupe
