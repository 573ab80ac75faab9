#pragma once
// Rotary position embedding in the Hugging Face "rotate half" layout: within the first
// rotary_dims = 2 * inv_freq.size() dimensions of a head, dimension i pairs with
// i + rotary_dims/2 and turns by position · inv_freq[i] (model/rope_frequencies.hpp); the rest
// of the head (Phi-4-mini's partial rotary) is left as it is. cos and sin are scaled by the
// rope's attention factor (YaRN, longrope).

#include <cstdint>

#include "backends/cpu/thread_pool.hpp"
#include "model/rope_frequencies.hpp"

namespace troupe::cpu {

// Rotates q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim] in
// place (rows ldq / ldk floats apart) for each token's position.
void apply_rope(thread_pool& pool, float* q, int64_t ldq, int num_heads, float* k, int64_t ldk, int num_kv_heads,
                int64_t num_tokens, int head_dim, const int32_t* positions, const rope_parameters& rope);

}  // namespace troupe::cpu
