#pragma once
// A model that times its inner model's forwards, for benchmarks that need a backend's busy time
// inside an engine or a pipeline: forwards that prefill (rows without logits: a prompt's chunk)
// apart from decode and verification ones (every row sampled or verified). Everything else is
// passed through.

#include <chrono>
#include <memory>
#include <string>

#include "model/model.hpp"

namespace troupe::bench {

class timed_model final : public model {
 public:
  explicit timed_model(std::unique_ptr<model> inner) : inner_(std::move(inner)) {}
  const model_config& config() const override { return inner_->config(); }
  kv_cache_shape kv_shape() const override { return inner_->kv_shape(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  void forward(const forward_batch& batch, float* logits) override {
    const auto start = std::chrono::steady_clock::now();
    inner_->forward(batch, logits);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (batch.num_tokens() > batch.num_logits()) {
      prefill_seconds += seconds;
      ++num_prefill_forwards;
    } else {
      decode_seconds += seconds;
    }
  }
  double busy_seconds() const { return prefill_seconds + decode_seconds; }
  void reset() {
    prefill_seconds = decode_seconds = 0;
    num_prefill_forwards = 0;
  }

  double prefill_seconds = 0;
  double decode_seconds = 0;
  int num_prefill_forwards = 0;

 private:
  std::unique_ptr<model> inner_;
};

}  // namespace troupe::bench
