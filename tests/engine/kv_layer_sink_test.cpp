// The engine's side of the KV connector: the model_runner calls its kv_layer_sink in the order
// engine/kv_layer_sink.hpp promises (ended and preempted requests forgotten, started ones
// started, prepare, every layer in order from inside the forward, finish_step), and not at all
// for layers when prepare says no entry streams. No KV plane: a sink that records the calls.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/kv_layer_sink.hpp"
#include "engine/model_runner.hpp"
#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

constexpr int num_layers = 3;

// kv_echo_model whose forward says each of its layers' KV is written, as a backend does.
class layered_echo_model : public testing::kv_echo_model {
 public:
  using kv_echo_model::kv_echo_model;
  void forward(const forward_batch& batch, float* logits) override {
    kv_echo_model::forward(batch, logits);
    in_forward = true;
    for (int layer = 0; layer < num_layers; ++layer) {
      if (batch.after_layer_kv) batch.after_layer_kv(layer);
    }
    in_forward = false;
  }
  bool in_forward = false;
};

class recording_sink final : public kv_layer_sink {
 public:
  recording_sink(std::vector<std::string>& calls, const layered_echo_model& m) : calls_(calls), model_(m) {}
  void start(int64_t request_id, uint64_t transfer_id) override {
    calls_.push_back("start " + std::to_string(request_id) + " " + std::to_string(transfer_id));
  }
  void forget(int64_t request_id, bool preempted) override {
    calls_.push_back("forget " + std::to_string(request_id) + (preempted ? " preempted" : ""));
  }
  bool prepare(const step_plan& plan, const std::vector<const std::vector<int32_t>*>& tables) override {
    std::string call = "prepare";
    for (size_t i = 0; i < plan.sequences.size(); ++i) {
      call += " " + std::to_string(plan.sequences[i].request_id) + ":" + std::to_string(tables.at(i)->size());
    }
    calls_.push_back(call);
    return plan.sequences.front().kv_send_transfer_id != 0 || streams_anyway;
  }
  void on_layer_written(int layer) override {
    calls_.push_back("layer " + std::to_string(layer) + (model_.in_forward ? "" : " (outside the forward)"));
  }
  void finish_step() override { calls_.push_back("finish"); }
  bool streams_anyway = false;

 private:
  std::vector<std::string>& calls_;
  const layered_echo_model& model_;
};

scheduled_sequence first_chunk(int64_t request_id, uint64_t transfer_id, std::vector<int32_t> blocks) {
  scheduled_sequence s;
  s.request_id = request_id;
  s.new_token_ids = {5, 6, 7, 8, 9};
  s.block_table = std::move(blocks);
  s.params = testing::greedy(4);
  s.num_prompt_tokens = 5;
  s.sample = true;
  s.kv_send_transfer_id = transfer_id;
  return s;
}

TEST(kv_layer_sink, the_runner_calls_its_sink_in_the_order_the_interface_promises) {
  layered_echo_model model(16, 4, 24);
  model_runner runner(model, 1);
  std::vector<std::string> calls;
  auto owned = std::make_unique<recording_sink>(calls, model);
  recording_sink& sink = *owned;
  runner.stream_kv_to(std::move(owned));

  // Request 1 streams (a send transfer), request 2 does not: the sink forgets 2.
  step_plan first;
  first.step_id = 1;
  first.sequences = {first_chunk(1, 9, {3, 4}), first_chunk(2, 0, {5, 6})};
  runner.run(first);
  EXPECT_EQ(calls, (std::vector<std::string>{"start 1 9", "forget 2", "prepare 1:2 2:2", "layer 0", "layer 1",
                                             "layer 2", "finish"}));

  // Ended and preempted requests are forgotten before anything else of the step; a step in which
  // nothing streams writes no layer into the sink and needs no finish.
  calls.clear();
  step_plan second;
  second.step_id = 2;
  second.finished_ids = {1};
  second.preempted_ids = {2};
  second.sequences = {first_chunk(3, 0, {7, 8})};
  runner.run(second);
  EXPECT_EQ(calls, (std::vector<std::string>{"forget 1", "forget 2 preempted", "forget 3", "prepare 3:2"}));

  // The sink alone decides what streams.
  calls.clear();
  sink.streams_anyway = true;
  step_plan third;
  third.step_id = 3;
  third.finished_ids = {3};
  third.sequences = {first_chunk(4, 0, {9, 10})};
  runner.run(third);
  EXPECT_EQ(calls, (std::vector<std::string>{"forget 3", "forget 4", "prepare 4:2", "layer 0", "layer 1", "layer 2",
                                             "finish"}));
}

TEST(kv_layer_sink, a_runner_without_a_sink_computes_a_streaming_request_and_keeps_its_kv) {
  layered_echo_model model(16, 4, 24);
  model_runner runner(model, 1);
  step_plan plan;
  plan.step_id = 1;
  plan.sequences = {first_chunk(1, 9, {3, 4})};
  const step_result result = runner.run(plan);
  ASSERT_EQ(result.tokens.size(), 1u);
  EXPECT_FALSE(runner.last_batch().after_layer_kv);
}

}  // namespace
}  // namespace troupe
