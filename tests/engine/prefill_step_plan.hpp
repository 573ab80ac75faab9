#pragma once
// A plan of one prefill step for the KV stream tests (kv_stream_out over the host, device and
// nccl paths): request_id computes tokens [begin, end) of its prompt; begin > 0 on a first step
// means the prefix cache supplied the blocks before it; `last` samples (the prompt's last chunk).

#include <cstdint>
#include <vector>

#include "engine/step_plan.hpp"

namespace troupe::test {

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

}  // namespace troupe::test
