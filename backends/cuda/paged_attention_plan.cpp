#include <algorithm>
#include <stdexcept>
#include <string>

#include "backends/cuda/paged_attention.hpp"

namespace troupe::cuda {

namespace {

constexpr int max_splits = 16;
constexpr int tokens_per_split = 256;  // below this a split's fixed cost outweighs its parallelism
}  // namespace

paged_attention_plan plan_paged_attention(const std::vector<int32_t>& query_start, int num_heads, int num_kv_heads,
                                          int head_dim, int max_context, int num_sms) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) {
    throw std::runtime_error("paged attention: num_heads " + std::to_string(num_heads) +
                             " is not a multiple of num_kv_heads " + std::to_string(num_kv_heads));
  }
  const int group = num_heads / num_kv_heads;
  paged_attention_plan plan;
  int max_rows = 0;
  for (size_t s = 0; s + 1 < query_start.size(); ++s) {
    max_rows = std::max(max_rows, (query_start[s + 1] - query_start[s]) * group);
  }
  // Rows a multiple of 4 (one per warp in the softmax), no more than the longest sequence needs.
  // Shared memory grows with rows * head_dim: wide heads get fewer rows (A100 allows 163 KiB).
  const int max_rows_per_cta = head_dim > 128 ? 32 : 64;
  plan.rows_per_cta = std::clamp((max_rows + 3) / 4 * 4, 4, max_rows_per_cta);
  for (size_t s = 0; s + 1 < query_start.size(); ++s) {
    const int rows = (query_start[s + 1] - query_start[s]) * group;
    for (int r = 0; r < rows; r += plan.rows_per_cta) {
      plan.work_items.push_back(static_cast<int32_t>(s));
      plan.work_items.push_back(r);
    }
  }
  // Split the context only when the CTAs would not fill the GPU twice over.
  const long long ctas = static_cast<long long>(plan.num_work()) * num_kv_heads;
  int splits =
      ctas == 0 ? 1 : static_cast<int>(std::clamp<long long>((2LL * num_sms + ctas - 1) / ctas, 1, max_splits));
  if (max_context > 0) splits = std::min(splits, std::max(1, max_context / tokens_per_split));
  plan.num_splits = splits;
  return plan;
}

size_t paged_attention_workspace_floats(const paged_attention_plan& plan, int num_kv_heads, int head_dim) {
  if (plan.num_splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(plan.num_work()) * num_kv_heads * plan.num_splits * plan.rows_per_cta;
  return rows * (head_dim + 2);
}

}  // namespace troupe::cuda
