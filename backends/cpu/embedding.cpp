#include "backends/cpu/embedding.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/row_kernels.hpp"

namespace troupe::cpu {

void embedding_lookup(thread_pool& pool, const weight_view& table, const int32_t* token_ids, int64_t num_tokens,
                      float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (token_ids[t] < 0 || token_ids[t] >= table.rows) {
      throw std::runtime_error("token id " + std::to_string(token_ids[t]) + " at row " + std::to_string(t) +
                               " is outside the vocabulary [0, " + std::to_string(table.rows) + ")");
    }
  }
  const to_f32_fn convert = active_kernels().to_f32[static_cast<int>(table.type)];
  const size_t stride = row_bytes(table.type, table.cols);
  const int64_t cols = table.cols;
  pool.parallel_for(0, num_tokens, 64, [&](int64_t begin, int64_t end, int) {
    std::vector<float> stored(table.input_order ? static_cast<size_t>(cols) : 0);  // [cols]
    for (int64_t t = begin; t < end; ++t) {
      float* row = out + t * cols;
      if (table.input_order) {
        convert(table.data + token_ids[t] * stride, cols, stored.data());
        for (int64_t j = 0; j < cols; ++j) row[table.input_order[j]] = stored[j];
      } else {
        convert(table.data + token_ids[t] * stride, cols, row);
      }
      if (table.row_scales) {
        const float scale = table.row_scales[token_ids[t]];
        for (int64_t c = 0; c < cols; ++c) row[c] *= scale;
      }
    }
  });
}

}  // namespace troupe::cpu
