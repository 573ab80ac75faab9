#include "backends/cpu/expert_routing.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe::cpu {

void route_tokens(const float* logits, int64_t num_tokens, const moe_config& moe, expert_routing& routing) {
  const int num_experts = moe.num_experts;
  const int k = moe.experts_per_token;
  if (k <= 0 || k > num_experts) {
    throw std::runtime_error("MoE routing: experts_per_token " + std::to_string(k) + " must be in 1.." +
                             std::to_string(num_experts));
  }
  routing.top_k = k;
  routing.experts.resize(num_tokens * k);
  routing.weights.resize(num_tokens * k);
  std::vector<float> scores(num_experts);
  std::vector<int32_t> order(num_experts);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = logits + t * num_experts;
    switch (moe.scoring) {
      case router_scoring::softmax: {
        const float top = *std::max_element(row, row + num_experts);
        double sum = 0;
        for (int e = 0; e < num_experts; ++e) sum += scores[e] = std::exp(row[e] - top);
        for (int e = 0; e < num_experts; ++e) scores[e] = static_cast<float>(scores[e] / sum);
        break;
      }
      case router_scoring::sigmoid:
        for (int e = 0; e < num_experts; ++e) scores[e] = 1.0f / (1.0f + std::exp(-row[e]));
        break;
      case router_scoring::softmax_over_top_k: std::copy(row, row + num_experts, scores.begin()); break;
    }
    for (int e = 0; e < num_experts; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); });
    int32_t* experts = routing.experts.data() + t * k;
    float* weights = routing.weights.data() + t * k;
    for (int j = 0; j < k; ++j) {
      experts[j] = order[j];
      weights[j] = scores[order[j]];
    }
    if (moe.scoring == router_scoring::softmax_over_top_k) {  // gpt-oss: softmax over the chosen logits
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += weights[j] = std::exp(weights[j] - scores[order[0]]);
      for (int j = 0; j < k; ++j) weights[j] = static_cast<float>(weights[j] / sum);
    }
    if (moe.norm_topk_prob) {
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += weights[j];
      for (int j = 0; j < k; ++j) weights[j] = static_cast<float>(weights[j] / sum);
    }
    if (moe.routed_scaling_factor != 1.0f) {
      for (int j = 0; j < k; ++j) weights[j] *= moe.routed_scaling_factor;
    }
  }
}

void dispatch_by_expert(const expert_routing& routing, int64_t num_tokens, int num_experts, expert_dispatch& dispatch) {
  const int k = routing.top_k;
  const int64_t assignments = num_tokens * k;
  dispatch.offsets.assign(num_experts + 1, 0);
  for (int64_t a = 0; a < assignments; ++a) ++dispatch.offsets[routing.experts[a] + 1];
  for (int e = 0; e < num_experts; ++e) dispatch.offsets[e + 1] += dispatch.offsets[e];
  dispatch.tokens.resize(assignments);
  dispatch.row_of.resize(assignments);
  std::vector<int32_t> next(dispatch.offsets.begin(), dispatch.offsets.end() - 1);
  for (int64_t a = 0; a < assignments; ++a) {  // token order within each expert
    const int32_t row = next[routing.experts[a]]++;
    dispatch.tokens[row] = static_cast<int32_t>(a / k);
    dispatch.row_of[a] = row;
  }
}

}  // namespace troupe::cpu
