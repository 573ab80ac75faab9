#pragma once
// The router of a mixture-of-experts layer, and the dispatch plan it implies: which rows of the
// batch each expert computes. Plain functions over plain buffers, so that the plan is what a
// later expert-parallel layer would send between workers (docs/design/models.md, "Mixture of
// experts").

#include <cstdint>
#include <vector>

#include "model/model_config.hpp"

namespace troupe::cpu {

// Each token's experts and their weights, best first.
struct expert_routing {
  int top_k = 0;
  std::vector<int32_t> experts;  // [num_tokens, top_k]
  std::vector<float> weights;    // [num_tokens, top_k]
};

// logits: [num_tokens, num_experts], the router's output (bias already added). Scoring as
// `moe` says (softmax then top-k, sigmoid then top-k, or top-k then softmax over those k),
// renormalised when norm_topk_prob, scaled by routed_scaling_factor. Ties go to the lower
// expert id.
void route_tokens(const float* logits, int64_t num_tokens, const moe_config& moe, expert_routing& routing);

// The routed (token, slot) pairs grouped by expert: expert e computes rows
// offsets[e] .. offsets[e + 1] of the gathered batch, row r holding token `tokens[r]`; slot
// (t, j) of the routing went to gathered row row_of[t * top_k + j]. Within an expert, tokens
// keep their batch order.
struct expert_dispatch {
  std::vector<int32_t> offsets;  // [num_experts + 1]
  std::vector<int32_t> tokens;   // [num_tokens * top_k]
  std::vector<int32_t> row_of;   // [num_tokens * top_k]
};

void dispatch_by_expert(const expert_routing& routing, int64_t num_tokens, int num_experts, expert_dispatch& dispatch);

}  // namespace troupe::cpu
