#include "backends/cpu/moe_layer.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe::cpu {

namespace {

void grow(std::vector<float>& buffer, int64_t size) {
  if (buffer.size() < static_cast<size_t>(size)) buffer.resize(size);
}

void add_bias(float* rows, int64_t n, int64_t ld, const std::vector<float>& bias) {
  if (bias.empty()) return;
  const int64_t dim = static_cast<int64_t>(bias.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < dim; ++i) rows[r * ld + i] += bias[i];
}

std::atomic<bool> experts_side_by_side{true};

}  // namespace

void moe_layer::set_experts_side_by_side(bool on) { experts_side_by_side.store(on, std::memory_order_relaxed); }

moe_layer::moe_layer(const moe_config& moe, const activation& act, int64_t hidden, moe_weights weights)
    : moe_(moe), act_(act), hidden_(hidden), weights_(std::move(weights)) {
  if (static_cast<int>(weights_.experts.size()) != moe_.num_experts) {
    throw std::runtime_error("MoE layer: " + std::to_string(weights_.experts.size()) + " experts' weights for " +
                             std::to_string(moe_.num_experts) + " experts");
  }
}

std::vector<weight_view*> moe_layer::matrices() {
  std::vector<weight_view*> out{&weights_.router, &weights_.shared_gate, &weights_.shared_up, &weights_.shared_down,
                                &weights_.shared_expert_gate};
  for (expert_weights& e : weights_.experts) {
    out.push_back(&e.gate);
    out.push_back(&e.up);
    out.push_back(&e.down);
  }
  std::erase_if(out, [](const weight_view* w) { return w->data == nullptr; });
  return out;
}

void moe_layer::compute_expert(thread_pool& pool, int expert, const float* in, int64_t rows, float* out,
                               expert_buffers& buffers) const {
  const expert_weights& w = weights_.experts[expert];
  const int64_t inter = w.gate.rows;
  grow(buffers.gate, rows * inter);
  grow(buffers.up, rows * inter);
  float* gate = buffers.gate.data();  // [rows, inter]
  float* up = buffers.up.data();      // [rows, inter]
  matmul(pool, in, rows, w.gate, gate, buffers.scratch);
  matmul(pool, in, rows, w.up, up, buffers.scratch);
  add_bias(gate, rows, inter, w.gate_bias);
  add_bias(up, rows, inter, w.up_bias);
  gated_activation(pool, act_, gate, up, inter, rows, inter, gate, inter);
  matmul(pool, gate, rows, w.down, out, buffers.scratch);  // out: [rows, hidden]
  add_bias(out, rows, hidden_, w.down_bias);
}

void moe_layer::forward(thread_pool& pool, const float* x, int64_t n, float* out, moe_workspace& ws) const {
  if (n <= 0) return;
  const int num_experts = moe_.num_experts;
  const int k = moe_.experts_per_token;
  const int64_t hidden = hidden_;

  // Route.
  grow(ws.logits, n * num_experts);
  float* logits = ws.logits.data();  // [n, experts]
  matmul(pool, x, n, weights_.router, logits, ws.scratch);
  add_bias(logits, n, num_experts, weights_.router_bias);
  route_tokens(logits, n, moe_, ws.routing);

  // Dispatch: gather each expert's tokens into one block of rows.
  dispatch_by_expert(ws.routing, n, num_experts, ws.dispatch);
  const int64_t assignments = n * k;
  grow(ws.gathered, assignments * hidden);
  grow(ws.expert_out, assignments * hidden);
  float* gathered = ws.gathered.data();      // [n * k, hidden] grouped by expert
  float* expert_out = ws.expert_out.data();  // [n * k, hidden]
  for (int64_t row = 0; row < assignments; ++row) {
    std::memcpy(gathered + row * hidden, x + static_cast<int64_t>(ws.dispatch.tokens[row]) * hidden,
                hidden * sizeof(float));
  }

  // Compute: one grouped product per expert with tokens; the others are never read.
  ws.experts_used.clear();
  int64_t most_rows = 0;
  for (int e = 0; e < num_experts; ++e) {
    const int64_t rows = ws.dispatch.offsets[e + 1] - ws.dispatch.offsets[e];
    if (rows == 0) continue;
    ws.experts_used.push_back(e);
    most_rows = std::max(most_rows, rows);
  }
  const int64_t num_used = static_cast<int64_t>(ws.experts_used.size());
  const bool side_by_side = experts_side_by_side.load(std::memory_order_relaxed) && pool.num_threads() > 1 &&
                            num_used >= pool.num_threads() && most_rows < matmul_gemm_min_rows();
  auto compute = [&](thread_pool& on, int e, expert_buffers& buffers) {
    const int64_t begin = ws.dispatch.offsets[e];
    compute_expert(on, e, gathered + begin * hidden, ws.dispatch.offsets[e + 1] - begin, expert_out + begin * hidden,
                   buffers);
  };
  if (side_by_side) {
    // Whole experts handed to whichever thread is free; each runs its products on a pool of
    // one (its own thread), so there is one dispatch per layer instead of four per expert.
    if (ws.per_thread.size() < static_cast<size_t>(pool.num_threads())) ws.per_thread.resize(pool.num_threads());
    pool.parallel_for_dynamic(0, num_used, 1, [&](int64_t first, int64_t last, int thread_index) {
      thread_pool alone(1);
      for (int64_t i = first; i < last; ++i) compute(alone, ws.experts_used[i], ws.per_thread[thread_index]);
    });
  } else {
    for (int e : ws.experts_used) compute(pool, e, ws.shared_buffers);
  }

  // Combine in slot order.
  const float* weights = ws.routing.weights.data();
  const int32_t* row_of = ws.dispatch.row_of.data();
  pool.parallel_for(0, n, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, hidden)),
                    [&](int64_t begin, int64_t end, int) {
                      for (int64_t t = begin; t < end; ++t) {
                        float* dst = out + t * hidden;
                        std::fill(dst, dst + hidden, 0.0f);
                        for (int j = 0; j < k; ++j) {
                          const float w = weights[t * k + j];
                          const float* src = expert_out + static_cast<int64_t>(row_of[t * k + j]) * hidden;
                          for (int64_t i = 0; i < hidden; ++i) dst[i] += w * src[i];
                        }
                      }
                    });

  // Shared expert (Qwen2-MoE): always on, scaled by its own sigmoid gate.
  if (weights_.shared_gate.data) {
    const int64_t inter = weights_.shared_gate.rows;
    grow(ws.shared_gate, n * inter);
    grow(ws.shared_up, n * inter);
    grow(ws.shared_out, n * hidden);
    grow(ws.shared_scale, n);
    float* gate = ws.shared_gate.data();    // [n, shared_inter]
    float* up = ws.shared_up.data();        // [n, shared_inter]
    float* shared = ws.shared_out.data();   // [n, hidden]
    float* scale = ws.shared_scale.data();  // [n]
    matmul(pool, x, n, weights_.shared_gate, gate, ws.scratch);
    matmul(pool, x, n, weights_.shared_up, up, ws.scratch);
    gated_activation(pool, act_, gate, up, inter, n, inter, gate, inter);
    matmul(pool, gate, n, weights_.shared_down, shared, ws.scratch);
    matmul(pool, x, n, weights_.shared_expert_gate, scale, ws.scratch);
    for (int64_t t = 0; t < n; ++t) {
      const float s = 1.0f / (1.0f + std::exp(-scale[t]));
      for (int64_t i = 0; i < hidden; ++i) out[t * hidden + i] += s * shared[t * hidden + i];
    }
  }
}

}  // namespace troupe::cpu
