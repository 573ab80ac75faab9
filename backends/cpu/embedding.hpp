#pragma once
// Token embedding lookup: one row of the embedding table per token, converted to f32.

#include <cstdint>

#include "backends/cpu/matmul.hpp"
#include "backends/cpu/thread_pool.hpp"

namespace troupe::cpu {

// out [num_tokens, table.cols] = table[token_ids[t]]. Throws std::runtime_error naming the
// token when an id is outside [0, table.rows).
void embedding_lookup(thread_pool& pool, const weight_view& table, const int32_t* token_ids, int64_t num_tokens,
                      float* out);

}  // namespace troupe::cpu
