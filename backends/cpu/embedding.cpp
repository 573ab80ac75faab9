#include "backends/cpu/embedding.hpp"

#include <stdexcept>
#include <string>

#include "backends/cpu/row_kernels.hpp"

namespace troupe::cpu {

void embedding_lookup(thread_pool& pool, const weight_view& table, const int32_t* token_ids,
                      int64_t num_tokens, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (token_ids[t] < 0 || token_ids[t] >= table.rows) {
      throw std::runtime_error("token id " + std::to_string(token_ids[t]) + " at row " +
                               std::to_string(t) + " is outside the vocabulary [0, " +
                               std::to_string(table.rows) + ")");
    }
  }
  const to_f32_fn convert = active_kernels().to_f32[static_cast<int>(table.type)];
  const size_t stride = row_bytes(table.type, table.cols);
  pool.parallel_for(0, num_tokens, 64, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      convert(table.data + token_ids[t] * stride, table.cols, out + t * table.cols);
    }
  });
}

}  // namespace troupe::cpu
