#pragma once
// A mixture-of-experts block on the CPU, every MoE architecture's (Mixtral, Qwen2/3-MoE,
// gpt-oss):
//
//   route    router logits [n, experts] -> each token's top-k experts and weights (expert_routing)
//   dispatch the (token, slot) pairs grouped by expert; the tokens of each expert gathered into
//            one contiguous block of rows
//   compute  per expert with any tokens: one gate, one up, one down product over its block
//            (cpu::matmul), the gated activation between; biases where the model has them.
//            When every expert's block is a few rows (decode) the experts run side by side,
//            each whole on one thread: a token's top-k experts are small products, and four
//            pool dispatches each (gate, up, activation, down) cost more than their arithmetic.
//            Each product still takes the path matmul gives its row count, so the bits are
//            the same either way
//   combine  out[t] = sum over t's slots j of weight[t, j] * expert_rows[row_of(t, j)], in slot
//            order (the same sum whatever else is in the batch)
//   shared   (Qwen2-MoE) + sigmoid(x . shared_gate) * shared SwiGLU(x)
//
// An expert no token chose is never read, so decoding one token reads top-k experts' weights,
// not all of them. Only `compute` touches expert weights: experts placed on other workers would
// replace it by a send of the gathered rows and a receive of their outputs, the dispatch plan
// being exactly the all-to-all's layout (docs/design/models.md).

#include <cstdint>
#include <vector>

#include "backends/cpu/expert_routing.hpp"
#include "backends/cpu/gated_activation.hpp"
#include "backends/cpu/matmul.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "model/model_config.hpp"

namespace troupe::cpu {

struct expert_weights {
  weight_view gate, up;          // [expert_intermediate, hidden]
  weight_view down;              // [hidden, expert_intermediate]
  std::vector<float> gate_bias;  // [expert_intermediate]; empty without biases
  std::vector<float> up_bias;    // [expert_intermediate]
  std::vector<float> down_bias;  // [hidden]
};

struct moe_weights {
  weight_view router;              // [experts, hidden]
  std::vector<float> router_bias;  // [experts]; empty without
  std::vector<expert_weights> experts;
  // Qwen2-MoE's shared expert (empty views without one).
  weight_view shared_gate, shared_up;  // [shared_intermediate, hidden]
  weight_view shared_down;             // [hidden, shared_intermediate]
  weight_view shared_expert_gate;      // [1, hidden]
};

// One expert's products on one thread: its intermediate rows and matmul's scratch.
struct expert_buffers {
  std::vector<float> gate, up;  // [rows, expert_intermediate]
  std::vector<float> scratch;
};

// Buffers reused from step to step.
struct moe_workspace {
  std::vector<float> logits;  // [n, experts]
  expert_routing routing;
  expert_dispatch dispatch;
  std::vector<float> gathered;                // [n * top_k, hidden] inputs, grouped by expert
  expert_buffers shared_buffers;              // compute_expert's, when every thread works on one expert
  std::vector<expert_buffers> per_thread;     // when the experts run side by side
  std::vector<float> expert_out;              // [n * top_k, hidden]
  std::vector<float> shared_gate, shared_up;  // [n, shared_intermediate]
  std::vector<float> shared_out;              // [n, hidden]
  std::vector<float> shared_scale;            // [n]
  std::vector<float> scratch;                 // matmul's converted weight slabs (router, shared expert)
  std::vector<int32_t> experts_used;          // expert ids with tokens in the last call (for tests and stats)
};

class moe_layer {
 public:
  moe_layer(const moe_config& moe, const activation& act, int64_t hidden, moe_weights weights);

  // out [n, hidden] = the block applied to x [n, hidden] (out must not alias x).
  void forward(thread_pool& pool, const float* x, int64_t n, float* out, moe_workspace& ws) const;

  // Expert e over `rows` gathered inputs in [rows, hidden] -> [rows, hidden] (biases included,
  // routing weight not). The one step that reads expert weights.
  void compute_expert(thread_pool& pool, int expert, const float* in, int64_t rows, float* out,
                      expert_buffers& buffers) const;

  const moe_config& config() const { return moe_; }

  // Every weight matrix of the block (router, experts, shared expert; empty views left out), for
  // the model to move at load as it moves its dense ones: repacked or into huge pages. Decode
  // reads the routed experts' bytes at random; from a file mapping each 4 KiB of them costs a
  // TLB miss.
  std::vector<weight_view*> matrices();

  // Whether experts with only a few rows each run side by side, each on one thread (the
  // default), or one after another across all threads: kept so a test can check both give the
  // same bits and a benchmark can time one against the other.
  static void set_experts_side_by_side(bool on);

 private:
  moe_config moe_;
  activation act_;
  int64_t hidden_;
  moe_weights weights_;
};

}  // namespace troupe::cpu
