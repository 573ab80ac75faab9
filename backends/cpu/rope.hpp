#pragma once
// Rotary position embedding in the Hugging Face "rotate half" layout: dimension i of a head
// pairs with dimension i + head_dim/2 and turns by position · inv_freq[i]
// (model/rope_frequencies.hpp).

#include <cstdint>
#include <vector>

#include "backends/cpu/thread_pool.hpp"
#include "model/model_config.hpp"

namespace troupe::cpu {

// Rotates q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim] in
// place (rows ldq / ldk floats apart) for each token's position.
void apply_rope(thread_pool& pool, float* q, int64_t ldq, int num_heads, float* k, int64_t ldk,
                int num_kv_heads, int64_t num_tokens, int head_dim, const int32_t* positions,
                const std::vector<float>& inv_freq);

}  // namespace troupe::cpu
