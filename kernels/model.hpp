#pragma once
// A model ready to run on one backend: owns its (device-side) weights view and its paged KV pool.

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/forward_batch.hpp"
#include "kernels/model_config.hpp"

namespace troupe {

struct kv_cache_shape {
  int num_blocks = 0;
  int block_size = 16;
};

class model {
 public:
  virtual ~model() = default;

  virtual const model_config& config() const = 0;
  virtual kv_cache_shape kv_shape() const = 0;
  virtual std::string backend_name() const = 0;

  // Runs the batch, writes its K/V into the pool, and fills `logits` [num_logits, vocab_size].
  virtual void forward(const forward_batch& batch, float* logits) = 0;
};

}  // namespace troupe
