#pragma once
// What the scheduler stage's tests share: a small KV pool and a short greedy request.

#include <cstdint>

#include "stages/scheduler_stage.hpp"

namespace troupe::test {

// 16 blocks of 4 tokens, 8 tokens a step, with one step in flight or two (async_scheduling).
inline engine_config small_stage_config(bool async_scheduling) {
  engine_config c;
  c.block_size = 4;
  c.num_kv_blocks = 16;
  c.max_num_batched_tokens = 8;
  c.max_num_seqs = 4;
  c.max_model_len = 64;
  c.async_scheduling = async_scheduling;
  return c;
}

// A five-token prompt, greedy, ending after `max_tokens`.
inline schedule_request make_request(int64_t id, int max_tokens) {
  schedule_request r;
  r.request_id = id;
  r.prompt_ids = {1, 5, 6, 7, 8};
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  return r;
}

}  // namespace troupe::test
