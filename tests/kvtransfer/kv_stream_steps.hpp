#pragma once
// Prefill steps for the KV stream tests (kv_layer_streamer over the host, device and nccl paths).

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/kv_layer_sink.hpp"
#include "engine/step_plan.hpp"

namespace troupe::test {

// One step's plan: request_id computes tokens [begin, end) of its prompt; begin > 0 on a first
// step means the prefix cache supplied the blocks before it; `last` samples (the last chunk).
inline step_plan prefill_step(int64_t request_id, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& blocks, int begin, int end, bool last) {
  scheduled_sequence s;
  s.request_id = request_id;
  s.num_computed_tokens = begin;
  s.new_token_ids.assign(prompt.begin() + begin, prompt.begin() + end);
  s.block_table = blocks;
  s.sample = last;
  step_plan plan;
  plan.sequences.push_back(s);
  return plan;
}

// Runs `prompt` through `out` (a kv_layer_streamer, or a connector's sink) in the chunks `cuts` names ({first computed
// token, ..., num_tokens}), each step writing every one of `num_layers` layers.
inline void stream_prompt(kv_layer_sink& out, int64_t request_id, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& blocks, const std::vector<int>& cuts, int num_layers) {
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const step_plan plan = prefill_step(request_id, prompt, blocks, cuts[i], cuts[i + 1], i + 2 == cuts.size());
    ASSERT_TRUE(out.prepare(plan, {&blocks})) << "chunk " << i;
    for (int layer = 0; layer < num_layers; ++layer) out.on_layer_written(layer);
    out.finish_step();
  }
}

}  // namespace troupe::test
