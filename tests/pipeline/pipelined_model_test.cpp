// A model pipelined across stage servers over TCP (issue 27): an engine driving stories260K cut
// into 2 and 3 stages, with 1 to 3 micro-batches and chunked prefill forced small, generates the
// same greedy tokens as the whole model; a stage that is not the one expected is refused at
// connect by name; a stage that goes away fails the next step by name instead of hanging; a
// stage keeps serving after a frame it refuses; KV streams out of one pipeline and into another
// (disaggregation with pipelined instances) and a stage refuses KV outside its pool by name.

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_model.hpp"
#include "engine/llm_engine.hpp"
#include "kvtransfer/kv_channel.hpp"
#include "kvtransfer/kv_tcp.hpp"
#include "model/loader/model_loader.hpp"
#include "pipeline/pipelined_model.hpp"
#include "pipeline/stage_health.hpp"
#include "pipeline/stage_link.hpp"
#include "pipeline/stage_server.hpp"
#include "tests/backends/cpu_greedy_support.hpp"
#include "tests/backends/pipeline_stage_support.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

constexpr int block_size = 4;
constexpr int num_blocks = 64;

using test::loaded_stage;

loaded_stage load_stage(layer_range layers, int blocks = num_blocks) {
  return test::load_stage((test::stories260k_dir / "hf").string(), layers, {blocks, block_size});
}

// Remote stages served here, each on its own port.
struct served_stages {
  std::vector<loaded_stage> stages;
  std::vector<std::unique_ptr<stage_server>> servers;
  std::vector<remote_stage> remote;
};

served_stages serve(const std::vector<layer_range>& ranges, const kv_channel_keys& keys = {}) {
  served_stages s;
  for (const layer_range& r : ranges) {
    s.stages.push_back(load_stage(r));
    stage_server_settings settings;
    settings.keys = keys;
    s.servers.push_back(std::make_unique<stage_server>(*s.stages.back().m, r, settings));
    s.remote.push_back({s.servers.back()->endpoint(), r});
  }
  return s;
}

sampling_params greedy(int max_tokens) {
  sampling_params p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// Eight requests (pairs share a prefix, for the prefix cache) through an engine on `m`; every
// request's tokens.
std::map<int64_t, std::vector<int32_t>> generate(std::unique_ptr<model> m, int token_budget) {
  engine_config config;
  config.block_size = block_size;
  config.max_num_batched_tokens = token_budget;
  config.max_num_seqs = 8;
  config.max_model_len = 128;
  llm_engine engine(std::move(m), config, std::nullopt, 1);
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383};
    for (int j = 0; j <= i % 4; ++j) prompt.push_back(300 + 11 * (i / 2) + j);
    EXPECT_TRUE(engine.add_request(prompt, greedy(6 + i), 0).ok());
  }
  std::map<int64_t, std::vector<int32_t>> outputs;
  for (int step = 0; step < 2000 && engine.has_unfinished(); ++step) {
    for (const auto& out : engine.step()) {
      auto& ids = outputs[out.request_id];
      ids.insert(ids.end(), out.token_ids.begin(), out.token_ids.end());
    }
  }
  EXPECT_FALSE(engine.has_unfinished());
  return outputs;
}

class pipelined_model_test : public ::testing::Test {
 protected:
  void SetUp() override { TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "hf"); }
};

TEST_F(pipelined_model_test, two_and_three_stages_generate_the_whole_models_tokens) {
  const auto expected = generate(load_stage({}).m, 64);
  ASSERT_EQ(expected.size(), 8u);
  for (int micro_batches : {1, 2, 3}) {
    for (int budget : {64, 5}) {  // 5: prompts in chunks, chunks and decodes mixed
      pipeline_settings settings;
      settings.micro_batches = micro_batches;
      {
        served_stages front = serve({{0, 2}});
        loaded_stage last = load_stage({2, 5});
        auto pipelined = make_pipelined_model(std::move(last.m), {2, 5}, front.remote, settings);
        EXPECT_EQ(generate(std::move(pipelined), budget), expected)
            << micro_batches << " micro-batches, budget " << budget;
        EXPECT_GT(front.servers[0]->frames_computed(), 0u);
      }
      {
        served_stages front = serve({{0, 1}, {1, 3}});
        loaded_stage last = load_stage({3, 5});
        auto pipelined = make_pipelined_model(std::move(last.m), {3, 5}, front.remote, settings);
        EXPECT_EQ(generate(std::move(pipelined), budget), expected)
            << "3 stages, " << micro_batches << " micro-batches";
      }
    }
  }
}

TEST_F(pipelined_model_test, a_stage_that_is_not_the_one_expected_is_refused_at_connect) {
  served_stages front = serve({{0, 2}});
  auto refusal = [&](layer_range claimed, layer_range last_layers, int last_blocks) -> std::string {
    loaded_stage last = load_stage(last_layers, last_blocks);
    try {
      make_pipelined_model(std::move(last.m), last_layers, {{front.remote[0].endpoint, claimed}}, {});
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(refusal({0, 3}, {3, 5}, num_blocks).find("the link expects layers 0-2, this stage holds 0-1"),
            std::string::npos);
  EXPECT_NE(refusal({0, 1}, {2, 5}, num_blocks).find("layers 1-1 are in no stage"), std::string::npos);
  // And the stage still serves a link that fits, the pipeline's pool the smaller of the two.
  loaded_stage last = load_stage({2, 5}, 2 * num_blocks);
  auto pipelined = make_pipelined_model(std::move(last.m), {2, 0}, front.remote, {});
  EXPECT_EQ(pipelined->kv_shape().num_blocks, num_blocks);
}

TEST_F(pipelined_model_test, a_stage_that_goes_away_fails_the_step_by_name) {
  served_stages front = serve({{0, 2}});
  loaded_stage last = load_stage({2, 5});
  pipeline_settings settings;
  settings.step_timeout = std::chrono::milliseconds(3000);
  auto pipelined = make_pipelined_model(std::move(last.m), {2, 5}, front.remote, settings);
  front.servers.clear();  // the stage's process is gone
  const forward_batch batch = test::one_sequence_batch({1, 403}, 0, 2, {0}, block_size);
  std::vector<float> logits(512);
  try {
    pipelined->forward(batch, logits.data());
    ADD_FAILURE() << "a step through a stage that is gone succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline stage 0-1 at " + front.remote[0].endpoint), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(pipelined->forward(batch, logits.data()), std::runtime_error);  // the link stays down
}

// Bounded wait until the process's board of lost stages satisfies `done`.
template <class Predicate>
std::string wait_for_board(Predicate done) {
  std::string text = stage_health_board::instance().down_text();
  for (int i = 0; i < 500 && !done(text); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    text = stage_health_board::instance().down_text();
  }
  return text;
}

// A stage that goes away and comes back on the same endpoint (what `troupe launch` does when it
// restarts it): the board names it while it is down, the link reconnects by itself, a sequence
// whose KV was computed before the restart is refused by name (the stage's KV went with it), and
// a new sequence gets the whole model's logits.
TEST_F(pipelined_model_test, a_restarted_stage_is_reconnected_and_kv_computed_before_is_refused) {
  served_stages front = serve({{0, 2}});
  const std::string endpoint = front.remote[0].endpoint;
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  loaded_stage last = load_stage({2, 5});
  loaded_stage whole = load_stage({});
  pipeline_settings settings;
  settings.step_timeout = std::chrono::milliseconds(3000);
  auto pipelined = make_pipelined_model(std::move(last.m), {2, 5}, front.remote, settings);
  const std::vector<int32_t> tokens = {1, 403, 407, 261, 378, 432};
  std::vector<float> logits(512), expected(512);
  pipelined->forward(test::one_sequence_batch(tokens, 0, 2, {0, 1}, block_size), logits.data());
  EXPECT_EQ(stage_health_board::instance().down_text(), "");

  front.servers.clear();  // the stage's process is gone
  EXPECT_THROW(pipelined->forward(test::one_sequence_batch(tokens, 2, 3, {0, 1}, block_size), logits.data()),
               std::runtime_error);
  const std::string down = wait_for_board([](const std::string& text) { return !text.empty(); });
  EXPECT_NE(down.find("pipeline stage 0-1 at " + endpoint + ": down"), std::string::npos) << down;
  try {
    pipelined->forward(test::one_sequence_batch(tokens, 0, 2, {2, 3}, block_size), logits.data());
    ADD_FAILURE() << "a step succeeded while the stage is down";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("the stage is down"), std::string::npos) << e.what();
  }

  stage_server_settings again;
  again.port = port;
  front.servers.push_back(std::make_unique<stage_server>(*front.stages[0].m, layer_range{0, 2}, again));
  EXPECT_EQ(wait_for_board([](const std::string& text) { return text.empty(); }), "") << "never reconnected";

  try {
    pipelined->forward(test::one_sequence_batch(tokens, 2, 3, {0, 1}, block_size), logits.data());
    ADD_FAILURE() << "a sequence read KV computed before its stage restarted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("a pipeline stage restarted since this request's KV was computed"),
              std::string::npos)
        << e.what();
  }
  const forward_batch fresh = test::one_sequence_batch(tokens, 0, 6, {4, 5}, block_size);
  pipelined->forward(fresh, logits.data());
  whole.m->forward(fresh, expected.data());
  EXPECT_EQ(logits, expected);
  // And that sequence goes on from the KV it computed since.
  pipelined->forward(test::one_sequence_batch({1, 403, 407, 261, 378, 432, 300}, 6, 7, {4, 5}, block_size),
                     logits.data());
}

// Disaggregation with pipelines on both sides (issue 27): a pipelined prefill streams its KV
// layer by layer (each layer once, in order), the remote stages' layers fetched over their links, the bytes the whole
// model exports; imported layer by layer into a pipeline cut elsewhere and into other blocks, it decodes the whole
// model's logits.
TEST_F(pipelined_model_test, kv_streams_out_of_one_pipeline_and_into_another) {
  served_stages prefill_front = serve({{0, 2}});
  loaded_stage prefill_last = load_stage({2, 5});
  auto prefill = make_pipelined_model(std::move(prefill_last.m), {2, 5}, prefill_front.remote, {});
  loaded_stage whole = load_stage({});
  const model_config& c = whole.m->config();
  const std::vector<int32_t> tokens = {1, 403, 407, 261, 378, 432, 300};
  const std::vector<int32_t> prefill_blocks = {0, 1};
  std::vector<float> logits(512), expected(512);

  forward_batch batch = test::one_sequence_batch(tokens, 0, 6, prefill_blocks, block_size);
  std::vector<int> layers_streamed;
  std::vector<std::vector<std::byte>> layer_kv;
  batch.after_layer_kv = [&](int layer) {
    layers_streamed.push_back(layer);
    const kv_span_header span = kv_span_for(c, prefill->kv_shape(), 2, layer, 1, dtype::f32);
    layer_kv.emplace_back(kv_span_bytes(span));
    prefill->export_kv(prefill_blocks, layer, 1, dtype::f32, layer_kv.back());
  };
  prefill->forward(batch, logits.data());
  whole.m->forward(test::one_sequence_batch(tokens, 0, 6, prefill_blocks, block_size), expected.data());
  EXPECT_EQ(logits, expected);
  EXPECT_EQ(layers_streamed, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(prefill_front.servers[0]->kv_frames(), 2u);  // layers 0 and 1 came from the stage

  // Every layer at once, in both element types: the whole model's bytes.
  for (dtype element : {dtype::f32, dtype::f16}) {
    const size_t bytes = kv_span_bytes(kv_span_for(c, prefill->kv_shape(), 2, 0, c.num_layers, element));
    std::vector<std::byte> from_pipeline(bytes), from_whole(bytes);
    prefill->export_kv(prefill_blocks, 0, c.num_layers, element, from_pipeline);
    whole.m->export_kv(prefill_blocks, 0, c.num_layers, element, from_whole);
    EXPECT_TRUE(from_pipeline == from_whole) << dtype_name(element);
  }

  // Into a 3-stage decode pipeline, into blocks 7 and 9, one layer at a time as the KV plane
  // sends it; then a decode step reads it.
  served_stages decode_front = serve({{0, 1}, {1, 3}});
  loaded_stage decode_last = load_stage({3, 5});
  auto decode = make_pipelined_model(std::move(decode_last.m), {3, 5}, decode_front.remote, {});
  const std::vector<int32_t> decode_blocks = {7, 9};
  for (int layer = 0; layer < c.num_layers; ++layer) {
    decode->import_kv(decode_blocks, kv_span_for(c, decode->kv_shape(), 2, layer, 1, dtype::f32),
                      layer_kv[static_cast<size_t>(layer)]);
  }
  EXPECT_EQ(decode_front.servers[0]->kv_frames(), 1u);
  EXPECT_EQ(decode_front.servers[1]->kv_frames(), 2u);
  decode->forward(test::one_sequence_batch(tokens, 6, 7, decode_blocks, block_size), logits.data());
  whole.m->forward(test::one_sequence_batch(tokens, 6, 7, prefill_blocks, block_size), expected.data());
  EXPECT_EQ(logits, expected);
}

// Two prompts in one forward, so two micro-batches: the first in blocks 0-1, the second in
// blocks 2 + shift and 3 + shift; logits of each one's last token.
forward_batch two_sequence_batch(int shift = 0) {
  forward_batch batch = test::one_sequence_batch({1, 403, 407, 261, 378, 432}, 0, 6, {0, 1}, block_size);
  const forward_batch other =
      test::one_sequence_batch({1, 300, 311, 322, 333, 344, 355}, 0, 7, {2 + shift, 3 + shift}, block_size);
  batch.token_ids.insert(batch.token_ids.end(), other.token_ids.begin(), other.token_ids.end());
  batch.positions.insert(batch.positions.end(), other.positions.begin(), other.positions.end());
  batch.slot_mapping.insert(batch.slot_mapping.end(), other.slot_mapping.begin(), other.slot_mapping.end());
  batch.query_start = {0, 6, 13};
  batch.context_lengths = {6, 7};
  batch.block_table_start = {0, 2, 4};
  batch.block_tables = {0, 1, 2 + shift, 3 + shift};
  batch.logits_rows = {5, 12};
  return batch;
}

// The local stage of a pipeline, saying when each of its forwards begins and ends in a log the
// test shares with its after_layer_kv.
class logged_stage final : public model {
 public:
  logged_stage(std::unique_ptr<model> inner, std::vector<std::string>& log) : inner_(std::move(inner)), log_(log) {}
  const model_config& config() const override { return inner_->config(); }
  kv_cache_shape kv_shape() const override { return inner_->kv_shape(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  dtype kv_dtype() const override { return inner_->kv_dtype(); }
  void export_kv(std::span<const int32_t> block_ids, int first_layer, int num_layers, dtype element,
                 std::span<std::byte> out) const override {
    inner_->export_kv(block_ids, first_layer, num_layers, element, out);
  }
  void forward(const forward_batch& batch, float* logits) override {
    log_.push_back("local begins");
    inner_->forward(batch, logits);
    log_.push_back("local ends");
  }

 private:
  std::unique_ptr<model> inner_;
  std::vector<std::string>& log_;
};

// A pipelined prefill streams its KV while it computes, not after: a remote stage's layers as
// soon as every micro-batch has left it (before the last micro-batch's local layers run), the
// local layers inside that last micro-batch's forward, each once every micro-batch wrote it. The
// logits and the streamed bytes are the whole model's.
TEST_F(pipelined_model_test, a_pipelined_prefill_streams_each_stages_kv_while_it_computes) {
  served_stages front = serve({{0, 1}, {1, 3}});
  loaded_stage last = load_stage({3, 5});
  loaded_stage whole = load_stage({});
  const model_config& c = whole.m->config();
  std::vector<std::string> log;
  pipeline_settings settings;
  settings.micro_batches = 2;
  auto prefill =
      make_pipelined_model(std::make_unique<logged_stage>(std::move(last.m), log), {3, 5}, front.remote, settings);

  forward_batch batch = two_sequence_batch();  // two micro-batches: blocks 0-1 and 2-3
  const std::vector<int32_t> blocks = {0, 1, 2, 3};
  std::vector<std::vector<std::byte>> layer_kv;
  batch.after_layer_kv = [&](int layer) {
    log.push_back("layer " + std::to_string(layer));
    const kv_span_header span = kv_span_for(c, prefill->kv_shape(), 4, layer, 1, dtype::f32);
    layer_kv.emplace_back(kv_span_bytes(span));
    prefill->export_kv(blocks, layer, 1, dtype::f32, layer_kv.back());
  };
  std::vector<float> logits(2 * 512);
  prefill->forward(batch, logits.data());

  ASSERT_EQ(layer_kv.size(), static_cast<size_t>(c.num_layers)) << ::testing::PrintToString(log);
  std::vector<std::string> layers_in_order;
  for (const std::string& event : log) {
    if (event.starts_with("layer")) layers_in_order.push_back(event);
  }
  EXPECT_EQ(layers_in_order, (std::vector<std::string>{"layer 0", "layer 1", "layer 2", "layer 3", "layer 4"}));
  // The last local forward: layers 3 and 4 inside it, the remote stages' before it.
  const auto index_of = [&](const std::string& event) {
    return std::find(log.begin(), log.end(), event) - log.begin();
  };
  const auto last_begin = log.rend() - std::find(log.rbegin(), log.rend(), "local begins") - 1;
  EXPECT_EQ(std::count(log.begin(), log.end(), "local begins"), 2) << ::testing::PrintToString(log);
  EXPECT_LT(index_of("layer 2"), last_begin) << ::testing::PrintToString(log);
  EXPECT_GT(index_of("layer 3"), last_begin) << ::testing::PrintToString(log);
  EXPECT_EQ(log.back(), "local ends") << ::testing::PrintToString(log);

  std::vector<float> expected(2 * 512);
  forward_batch plain = batch;
  plain.after_layer_kv = nullptr;
  whole.m->forward(plain, expected.data());  // the same blocks of the whole model's own pool
  EXPECT_EQ(logits, expected);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    std::vector<std::byte> from_whole(layer_kv[static_cast<size_t>(layer)].size());
    whole.m->export_kv(blocks, layer, 1, dtype::f32, from_whole);
    EXPECT_TRUE(from_whole == layer_kv[static_cast<size_t>(layer)]) << "layer " << layer;
  }
}

// The local stage of a pipeline whose first forward fails.
class failing_once_stage final : public model {
 public:
  explicit failing_once_stage(std::unique_ptr<model> inner) : inner_(std::move(inner)) {}
  const model_config& config() const override { return inner_->config(); }
  kv_cache_shape kv_shape() const override { return inner_->kv_shape(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  void forward(const forward_batch& batch, float* logits) override {
    if (!failed_) {
      failed_ = true;
      throw std::runtime_error("the local stage failed on purpose");
    }
    inner_->forward(batch, logits);
  }

 private:
  std::unique_ptr<model> inner_;
  bool failed_ = false;
};

// A local stage that fails on the first of two micro-batches fails the forward with its error
// only once the second is back from the remote stage (it was still there, writing into the
// forward's buffers), and the next forward is the whole model's.
TEST_F(pipelined_model_test, a_local_stage_failure_waits_for_every_micro_batch_before_it_is_thrown) {
  served_stages front = serve({{0, 2}});
  loaded_stage last = load_stage({2, 5});
  loaded_stage whole = load_stage({});
  pipeline_settings settings;
  settings.micro_batches = 2;
  auto pipelined =
      make_pipelined_model(std::make_unique<failing_once_stage>(std::move(last.m)), {2, 5}, front.remote, settings);
  std::vector<float> logits(2 * 512), expected(2 * 512);
  try {
    pipelined->forward(two_sequence_batch(), logits.data());
    ADD_FAILURE() << "the forward succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("failed on purpose"), std::string::npos) << e.what();
  }
  EXPECT_EQ(front.servers[0]->frames_computed(), 2u);  // both micro-batches were computed there
  const forward_batch again = two_sequence_batch(4);
  pipelined->forward(again, logits.data());
  whole.m->forward(again, expected.data());
  EXPECT_EQ(logits, expected);
}

// A decode pipeline runs no forward while it has nothing to decode: a stage that restarted
// then is installed by the next import, which goes to the new stage, and the decode that follows
// reads it.
TEST_F(pipelined_model_test, an_import_after_a_stage_restarted_reaches_the_new_stage_without_a_forward) {
  served_stages front = serve({{0, 2}});
  const std::string endpoint = front.remote[0].endpoint;
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  // Listening on a port of its own choosing, as `troupe launch` starts a stage, so that the
  // restarted one can bind it again while the old connection's end waits out TIME_WAIT.
  stage_server_settings fixed;
  fixed.port = port;
  front.servers.clear();
  front.servers.push_back(std::make_unique<stage_server>(*front.stages[0].m, layer_range{0, 2}, fixed));
  loaded_stage last = load_stage({2, 5});
  loaded_stage whole = load_stage({});
  const model_config& c = whole.m->config();
  pipeline_settings settings;
  settings.reconnect_first_delay = std::chrono::milliseconds(20);
  settings.reconnect_max_delay = std::chrono::milliseconds(50);
  auto decode = make_pipelined_model(std::move(last.m), {2, 5}, front.remote, settings);

  front.servers.clear();  // the stage's process is gone, and comes back on its port
  EXPECT_NE(wait_for_board([](const std::string& text) { return !text.empty(); }), "") << "never noticed";
  front.servers.push_back(std::make_unique<stage_server>(*front.stages[0].m, layer_range{0, 2}, fixed));
  EXPECT_EQ(wait_for_board([](const std::string& text) { return text.empty(); }), "") << "never reconnected";

  const std::vector<int32_t> tokens = {1, 403, 407, 261, 378, 432, 300};
  const std::vector<int32_t> blocks = {0, 1};
  std::vector<float> logits(512), expected(512);
  whole.m->forward(test::one_sequence_batch(tokens, 0, 6, blocks, block_size), expected.data());
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const kv_span_header span = kv_span_for(c, whole.m->kv_shape(), 2, layer, 1, dtype::f32);
    std::vector<std::byte> bytes(kv_span_bytes(span));
    whole.m->export_kv(blocks, layer, 1, dtype::f32, bytes);
    decode->import_kv(blocks, kv_span_for(c, decode->kv_shape(), 2, layer, 1, dtype::f32), bytes);
  }
  EXPECT_EQ(front.servers[0]->kv_frames(), 2u);  // layers 0 and 1, into the stage that came back
  decode->forward(test::one_sequence_batch(tokens, 6, 7, blocks, block_size), logits.data());
  whole.m->forward(test::one_sequence_batch(tokens, 6, 7, blocks, block_size), expected.data());
  EXPECT_EQ(logits, expected);
}

// A stage checks a KV request against its own pool and layers before it reads a byte of data,
// answers it with a failure naming what was wrong, and serves the link on.
TEST_F(pipelined_model_test, a_stage_refuses_kv_outside_its_pool_or_layers_by_name) {
  served_stages front = serve({{0, 2}});
  const model_config& c = front.stages[0].m->config();
  const stage_hello expected{0, 2, c.num_layers, c.hidden_size, c.vocab_size, block_size, num_blocks};
  stage_link link(front.remote[0].endpoint, {0, 2}, expected, std::chrono::milliseconds(2000),
                  std::chrono::milliseconds(5000));
  const kv_span_header one_block = kv_span_for(c, front.stages[0].m->kv_shape(), 1, 0, 1, dtype::f32);
  std::vector<std::byte> data(kv_span_bytes(one_block));
  const std::vector<int32_t> outside = {num_blocks + 5};
  EXPECT_NE(link.import_kv(outside, one_block, data).find(std::to_string(num_blocks + 5)), std::string::npos);
  kv_span_header layer_three = one_block;
  layer_three.first_layer = 3;
  const std::vector<int32_t> inside = {3};
  EXPECT_NE(link.import_kv(inside, layer_three, data).find("is not in this stage (layers 0-1)"), std::string::npos);
  EXPECT_EQ(link.broken(), "");
  EXPECT_EQ(link.import_kv(inside, one_block, data), "");
  std::vector<std::byte> back(data.size(), std::byte{1});
  EXPECT_EQ(link.export_kv(inside, one_block, back), "");
  EXPECT_TRUE(back == data);
  EXPECT_EQ(front.servers[0]->frames_refused(), 2u);
}

// A stage lost while no step runs is on the board (and its link reconnecting) at once: /health
// says so before any request is sent into it (issue 27's idle liveness probe).
TEST_F(pipelined_model_test, an_idle_stage_that_goes_away_is_reported_without_a_step) {
  served_stages front = serve({{0, 2}});
  const std::string endpoint = front.remote[0].endpoint;
  loaded_stage last = load_stage({2, 5});
  pipeline_settings settings;
  settings.step_timeout = std::chrono::milliseconds(3000);
  auto pipelined = make_pipelined_model(std::move(last.m), {2, 5}, front.remote, settings);
  std::vector<float> logits(512);
  pipelined->forward(test::one_sequence_batch({1, 403}, 0, 2, {0}, block_size), logits.data());
  // Idle for longer than a probe: still up.
  std::this_thread::sleep_for(3 * stage_link::idle_probe_interval);
  EXPECT_EQ(stage_health_board::instance().down_text(), "");
  front.servers.clear();  // the stage's process is gone; no step is asked of it
  const std::string down = wait_for_board([](const std::string& text) { return !text.empty(); });
  // "down" and why: the probe's reason, or already the reconnector's first failed attempt.
  EXPECT_NE(down.find("pipeline stage 0-1 at " + endpoint + ": down"), std::string::npos) << down;
}

TEST_F(pipelined_model_test, a_stage_answers_a_bad_frame_with_a_failure_and_keeps_serving) {
  served_stages front = serve({{0, 2}});
  // A raw client: hello, then a work frame whose token id is outside the vocabulary.
  std::string why;
  const int fd =
      kv_tcp_connect(front.remote[0].endpoint, std::chrono::milliseconds(2000), std::chrono::milliseconds(2000), why);
  ASSERT_GE(fd, 0) << why;
  kv_tcp_prepare_accepted(fd, std::chrono::milliseconds(5000));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  const model_config& c = front.stages[0].m->config();
  stage_frame_header hello;
  hello.kind = stage_frame_kind::hello;
  hello.payload_bytes = stage_hello_bytes;
  std::array<std::byte, stage_frame_header_bytes> head{};
  encode_stage_frame_header(hello, head);
  ASSERT_EQ(
      kv_tcp_write_frame(fd, head, encode_stage_hello({0, 2, c.num_layers, c.hidden_size, c.vocab_size, block_size, 8}),
                         deadline, why),
      kv_tcp_write::done);
  stage_frame_limits limits;
  limits.hidden_size = c.hidden_size;
  ASSERT_TRUE(kv_tcp_read_exact(fd, head, deadline, why)) << why;
  stage_frame_header ack = decode_stage_frame_header(head, limits);
  ASSERT_EQ(ack.kind, stage_frame_kind::hello_ack);
  std::vector<std::byte> ack_payload(ack.payload_bytes);
  ASSERT_TRUE(kv_tcp_read_exact(fd, ack_payload, deadline, why));

  forward_batch bad;
  bad.token_ids = {9999};
  bad.positions = {0};
  bad.slot_mapping = {0};
  bad.query_start = {0, 1};
  bad.context_lengths = {1};
  bad.block_table_start = {0, 1};
  bad.block_tables = {0};
  std::vector<std::byte> frame;
  encode_work_frame(1, 0, bad, 0, frame);
  ASSERT_EQ(kv_tcp_write_frame(fd, frame, {}, deadline, why), kv_tcp_write::done);
  ASSERT_TRUE(kv_tcp_read_exact(fd, head, deadline, why)) << why;
  const stage_frame_header answer = decode_stage_frame_header(head, limits);
  ASSERT_EQ(answer.kind, stage_frame_kind::failure);
  std::string text(answer.payload_bytes, '\0');
  ASSERT_TRUE(kv_tcp_read_exact(fd, std::as_writable_bytes(std::span(text.data(), text.size())), deadline, why));
  EXPECT_NE(text.find("token id 9999 outside the vocabulary"), std::string::npos) << text;

  // The same connection computes a good frame next.
  bad.token_ids = {403};
  encode_work_frame(2, 0, bad, 0, frame);
  ASSERT_EQ(kv_tcp_write_frame(fd, frame, {}, deadline, why), kv_tcp_write::done);
  ASSERT_TRUE(kv_tcp_read_exact(fd, head, deadline, why)) << why;
  const stage_frame_header result = decode_stage_frame_header(head, limits);
  EXPECT_EQ(result.kind, stage_frame_kind::result);
  EXPECT_EQ(result.step_id, 2u);
  EXPECT_EQ(front.servers[0]->frames_refused(), 1u);
  ::close(fd);
}

// Stage links with the cluster's credentials (curve://): a member's engine is served and answers
// like the whole model; an engine whose key is not a member's never gets a hello answered; a
// curve:// stage without credentials is refused by name.
TEST_F(pipelined_model_test, curve_links_serve_members_only) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("troupe_pipeline_keys_" + std::to_string(::getpid()));
  const std::filesystem::path outsiders = dir / "outsiders";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(outsiders);
  write_kv_channel_keys(dir, "stage");
  write_kv_channel_keys(dir, "engine");
  write_kv_channel_keys(outsiders, "intruder");
  const auto expected = generate(load_stage({}).m, 64);
  served_stages front = serve({{0, 2}}, load_kv_channel_keys(dir, "stage"));
  ASSERT_TRUE(front.remote[0].endpoint.starts_with("curve://127.0.0.1:")) << front.remote[0].endpoint;
  {
    pipeline_settings settings;
    settings.keys = load_kv_channel_keys(dir, "engine");
    auto pipelined = make_pipelined_model(load_stage({2, 5}).m, {2, 5}, front.remote, settings);
    EXPECT_EQ(generate(std::move(pipelined), 64), expected);
  }
  auto refusal = [&](const kv_channel_keys& keys) -> std::string {
    pipeline_settings settings;
    settings.keys = keys;
    settings.connect_timeout = std::chrono::milliseconds(1500);
    try {
      make_pipelined_model(load_stage({2, 5}).m, {2, 5}, front.remote, settings);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(refusal(load_kv_channel_keys(outsiders, "intruder")).find("pipeline stage 0-1 at curve://"),
            std::string::npos);
  EXPECT_NE(refusal({}).find("needs the cluster's credentials"), std::string::npos);
  // A member still gets in after the refusals.
  pipeline_settings settings;
  settings.keys = load_kv_channel_keys(dir, "engine");
  std::unique_ptr<model> member;
  ASSERT_NO_THROW(member = make_pipelined_model(load_stage({2, 5}).m, {2, 5}, front.remote, settings));
  // Over CURVE too, a stage that goes away while idle is reported without a step.
  std::this_thread::sleep_for(3 * stage_link::idle_probe_interval);
  EXPECT_EQ(stage_health_board::instance().down_text(), "");
  front.servers.clear();
  const std::string down = wait_for_board([](const std::string& text) { return !text.empty(); });
  EXPECT_NE(down.find("pipeline stage 0-1 at curve://"), std::string::npos) << down;
  EXPECT_NE(down.find(": down"), std::string::npos) << down;
  member.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace troupe
