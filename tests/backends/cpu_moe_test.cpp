// The mixture-of-experts block: its router against the formulas of each family, and the whole
// block against a dense, naive evaluation of every chosen expert written out here.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backends/cpu/expert_routing.hpp"
#include "backends/cpu/moe_layer.hpp"
#include "tests/backends/cpu_test_support.hpp"

namespace troupe {
namespace {

moe_config softmax_moe(int experts, int k, bool norm) {
  moe_config moe;
  moe.num_experts = experts;
  moe.experts_per_token = k;
  moe.expert_intermediate_size = 8;
  moe.norm_topk_prob = norm;
  return moe;
}

TEST(cpu_expert_routing, softmax_top_k_with_and_without_renormalisation) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f};  // one token, four experts
  double total = 0;
  for (float l : logits) total += std::exp(l);
  cpu::expert_routing plain, normalised;
  cpu::route_tokens(logits.data(), 1, softmax_moe(4, 2, false), plain);
  cpu::route_tokens(logits.data(), 1, softmax_moe(4, 2, true), normalised);
  EXPECT_EQ(plain.experts, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(plain.weights[0], std::exp(2.0) / total, 1e-6);
  EXPECT_NEAR(plain.weights[1], std::exp(1.0) / total, 1e-6);
  EXPECT_EQ(normalised.experts, plain.experts);
  EXPECT_NEAR(normalised.weights[0], std::exp(2.0) / (std::exp(2.0) + std::exp(1.0)), 1e-6);
  EXPECT_NEAR(normalised.weights[0] + normalised.weights[1], 1.0, 1e-6);
}

TEST(cpu_expert_routing, gpt_oss_softmax_over_the_chosen_logits_and_sigmoid_scores) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f, 3.0f, 0.0f};  // two tokens, three experts
  moe_config moe = softmax_moe(3, 2, false);
  moe.scoring = router_scoring::softmax_over_top_k;
  cpu::expert_routing routing;
  cpu::route_tokens(logits.data(), 2, moe, routing);
  EXPECT_EQ(routing.experts, (std::vector<int32_t>{1, 0, 1, 0}));
  EXPECT_NEAR(routing.weights[0], 1 / (1 + std::exp(0.5 - 2.0)), 1e-6);
  EXPECT_NEAR(routing.weights[2], 1 / (1 + std::exp(1.0 - 3.0)), 1e-6);

  moe.scoring = router_scoring::sigmoid;
  moe.routed_scaling_factor = 2.5f;
  cpu::route_tokens(logits.data(), 1, moe, routing);
  EXPECT_NEAR(routing.weights[0], 2.5 / (1 + std::exp(-2.0)), 1e-6);
  EXPECT_NEAR(routing.weights[1], 2.5 / (1 + std::exp(-0.5)), 1e-6);
}

TEST(cpu_expert_routing, ties_go_to_the_lower_expert_and_bad_top_k_is_refused) {
  const std::vector<float> logits = {1.0f, 1.0f, 1.0f, 0.0f};
  cpu::expert_routing routing;
  cpu::route_tokens(logits.data(), 1, softmax_moe(4, 2, true), routing);
  EXPECT_EQ(routing.experts, (std::vector<int32_t>{0, 1}));
  EXPECT_THROW(cpu::route_tokens(logits.data(), 1, softmax_moe(4, 5, true), routing), std::runtime_error);
}

TEST(cpu_expert_routing, dispatch_groups_tokens_by_expert_in_batch_order) {
  cpu::expert_routing routing;
  routing.top_k = 2;
  routing.experts = {2, 0, 0, 1, 2, 1};  // three tokens
  routing.weights.assign(6, 0.5f);
  cpu::expert_dispatch dispatch;
  cpu::dispatch_by_expert(routing, 3, 4, dispatch);
  EXPECT_EQ(dispatch.offsets, (std::vector<int32_t>{0, 2, 4, 6, 6}));  // expert 3: no tokens
  EXPECT_EQ(dispatch.tokens, (std::vector<int32_t>{0, 1, 1, 2, 0, 2}));
  for (int a = 0; a < 6; ++a) EXPECT_EQ(dispatch.tokens[dispatch.row_of[a]], a / 2) << a;
}

// Random f32 experts (and a shared expert) kept alive for the views.
struct random_moe {
  int64_t hidden = 16, inter = 8, shared_inter = 12;
  moe_config moe;
  std::vector<std::vector<float>> storage;
  cpu::moe_weights weights;

  cpu::weight_view matrix(int64_t rows, int64_t cols, uint32_t seed) {
    storage.push_back(test::random_floats(rows * cols, seed));
    return {dtype::f32, rows, cols, reinterpret_cast<const std::byte*>(storage.back().data())};
  }

  random_moe(int experts, int k, bool norm, bool shared, bool biases) {
    moe = softmax_moe(experts, k, norm);
    moe.expert_intermediate_size = static_cast<int>(inter);
    storage.reserve(8 * experts + 8);
    weights.router = matrix(experts, hidden, 1);
    for (int e = 0; e < experts; ++e) {
      cpu::expert_weights x;
      x.gate = matrix(inter, hidden, 10 + 3 * e);
      x.up = matrix(inter, hidden, 11 + 3 * e);
      x.down = matrix(hidden, inter, 12 + 3 * e);
      if (biases) {
        x.gate_bias = test::random_floats(inter, 500 + e);
        x.up_bias = test::random_floats(inter, 600 + e);
        x.down_bias = test::random_floats(hidden, 700 + e);
      }
      weights.experts.push_back(std::move(x));
    }
    if (shared) {
      moe.shared_expert_intermediate_size = static_cast<int>(shared_inter);
      weights.shared_gate = matrix(shared_inter, hidden, 2);
      weights.shared_up = matrix(shared_inter, hidden, 3);
      weights.shared_down = matrix(hidden, shared_inter, 4);
      weights.shared_expert_gate = matrix(1, hidden, 5);
    }
  }
};

double dot(const cpu::weight_view& w, int64_t row, const float* x) {
  const float* r = reinterpret_cast<const float*>(w.data) + row * w.cols;
  double sum = 0;
  for (int64_t i = 0; i < w.cols; ++i) sum += static_cast<double>(r[i]) * x[i];
  return sum;
}

// The block written out for one token: softmax, top-k, renormalise, each expert's SwiGLU, the
// weighted sum, the sigmoid-gated shared expert.
std::vector<double> naive(const random_moe& m, const float* x) {
  const int experts = m.moe.num_experts;
  std::vector<double> probs(experts);
  double total = 0;
  for (int e = 0; e < experts; ++e) total += probs[e] = std::exp(dot(m.weights.router, e, x));
  for (double& p : probs) p /= total;
  std::vector<int> order(experts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return probs[a] > probs[b]; });
  order.resize(m.moe.experts_per_token);
  double chosen = 0;
  for (int e : order) chosen += probs[e];
  auto swiglu = [&](const cpu::weight_view& gate, const cpu::weight_view& up, const cpu::weight_view& down,
                    const std::vector<float>* biases, std::vector<double>& out, double weight) {
    std::vector<float> h(gate.rows);
    for (int64_t i = 0; i < gate.rows; ++i) {
      const double g = dot(gate, i, x) + (biases ? biases[0][i] : 0.0);
      const double u = dot(up, i, x) + (biases ? biases[1][i] : 0.0);
      h[i] = static_cast<float>(g / (1 + std::exp(-g)) * u);
    }
    for (int64_t j = 0; j < down.rows; ++j) out[j] += weight * (dot(down, j, h.data()) + (biases ? biases[2][j] : 0.0));
  };
  std::vector<double> out(m.hidden, 0.0);
  for (int e : order) {
    const cpu::expert_weights& w = m.weights.experts[e];
    const std::vector<float> biases[3] = {w.gate_bias, w.up_bias, w.down_bias};
    swiglu(w.gate, w.up, w.down, w.gate_bias.empty() ? nullptr : biases, out,
           m.moe.norm_topk_prob ? probs[e] / chosen : probs[e]);
  }
  if (m.weights.shared_gate.data) {
    const double gate = 1 / (1 + std::exp(-dot(m.weights.shared_expert_gate, 0, x)));
    swiglu(m.weights.shared_gate, m.weights.shared_up, m.weights.shared_down, nullptr, out, gate);
  }
  return out;
}

void expect_naive(const random_moe& m, int64_t n) {
  cpu::thread_pool pool(2);
  const cpu::moe_layer layer(m.moe, cpu::activation{}, m.hidden, m.weights);
  const std::vector<float> x = test::random_floats(n * m.hidden, 99);
  std::vector<float> out(n * m.hidden);
  cpu::moe_workspace ws;
  layer.forward(pool, x.data(), n, out.data(), ws);
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<double> want = naive(m, x.data() + t * m.hidden);
    for (int64_t i = 0; i < m.hidden; ++i)
      ASSERT_NEAR(out[t * m.hidden + i], want[i], 1e-4 * (1 + std::abs(want[i]))) << t << "," << i;
  }
}

TEST(cpu_moe_layer, equals_a_naive_evaluation_of_the_chosen_experts) {
  expect_naive(random_moe(8, 2, true, false, false), 37);  // Mixtral / Qwen3-MoE style
  expect_naive(random_moe(6, 3, false, true, false), 21);  // Qwen2-MoE: no renormalisation, shared expert
  expect_naive(random_moe(4, 2, true, false, true), 9);    // biased experts
  expect_naive(random_moe(16, 4, true, false, false), 1);  // one decode token
}

// Decoding one token computes its top-k experts only: every other expert's weights are
// unreadable here (null data), and the block still gives the naive answer.
TEST(cpu_moe_layer, decode_reads_only_the_routed_experts) {
  random_moe m(16, 2, true, false, false);
  const std::vector<float> x = test::random_floats(m.hidden, 7);
  std::vector<float> logits(16);
  for (int e = 0; e < 16; ++e) logits[e] = static_cast<float>(dot(m.weights.router, e, x.data()));
  cpu::expert_routing routing;
  cpu::route_tokens(logits.data(), 1, m.moe, routing);
  random_moe pruned = m;
  for (int e = 0; e < 16; ++e) {
    if (std::find(routing.experts.begin(), routing.experts.end(), e) != routing.experts.end()) continue;
    pruned.weights.experts[e].gate.data = pruned.weights.experts[e].up.data = pruned.weights.experts[e].down.data =
        nullptr;
  }
  cpu::thread_pool pool(2);
  const cpu::moe_layer layer(pruned.moe, cpu::activation{}, pruned.hidden, pruned.weights);
  std::vector<float> out(m.hidden);
  cpu::moe_workspace ws;
  layer.forward(pool, x.data(), 1, out.data(), ws);
  EXPECT_EQ(ws.experts_used.size(), 2u);
  const std::vector<double> want = naive(m, x.data());
  for (int64_t i = 0; i < m.hidden; ++i) EXPECT_NEAR(out[i], want[i], 1e-4 * (1 + std::abs(want[i])));
}

// Experts with a few rows each run side by side, each whole on one thread; one after another
// across all threads otherwise. Each product takes the same path for its row count either way,
// so the outputs have the same bits: decode (1 token), a small batch, and a batch whose experts
// have too many rows to go side by side.
TEST(cpu_moe_layer, experts_side_by_side_give_the_same_bits_as_one_after_another) {
  const random_moe m(16, 4, true, false, false);
  const cpu::moe_layer layer(m.moe, cpu::activation{}, m.hidden, m.weights);
  cpu::thread_pool pool(3);
  for (int64_t n : {1, 2, 7, 80}) {
    const std::vector<float> x = test::random_floats(n * m.hidden, 11 + n);
    std::vector<float> out[2];
    for (bool side_by_side : {false, true}) {
      cpu::moe_layer::set_experts_side_by_side(side_by_side);
      out[side_by_side].assign(n * m.hidden, 0.0f);
      cpu::moe_workspace ws;
      layer.forward(pool, x.data(), n, out[side_by_side].data(), ws);
    }
    cpu::moe_layer::set_experts_side_by_side(true);
    EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float))) << n << " tokens";
    std::vector<double> want = naive(m, x.data());
    for (int64_t i = 0; i < m.hidden; ++i)
      ASSERT_NEAR(out[1][i], want[i], 1e-4 * (1 + std::abs(want[i]))) << n << " tokens, " << i;
  }
}

}  // namespace
}  // namespace troupe
