// A KV channel per pair of pipeline stages (issue 27): a prefill and a decode instance, each
// stories260K cut into a stage server (layers 0-1) and the engine's own layers (2-4), with a KV
// connector each over plain TCP. The decode's reservation leases its blocks at its stage too and
// names that stage's receiver; the prefill's stage pushes its layers straight there while the
// engines carry only layers 2-4, and the decode stage tells its engine once its layers are in.
// The decode then computes the whole model's logits. A released lease takes nothing more, and a
// decode whose pipeline is cut otherwise is refused by the prefill by name.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kvtransfer/kv_connector.hpp"
#include "pipeline/pipelined_model.hpp"
#include "pipeline/stage_server.hpp"
#include "tests/backends/cpu_greedy_support.hpp"
#include "tests/backends/pipeline_stage_support.hpp"
#include "tests/kvtransfer/kv_plane_support.hpp"
#include "tests/kvtransfer/kv_stream_steps.hpp"
#include "tests/shared_models.hpp"

namespace troupe::test {
namespace {

constexpr int block_size = 4;
constexpr int num_blocks = 64;
constexpr int64_t request_id = 42;

loaded_stage stage_of(layer_range layers) {
  return load_stage((stories260k_dir / "hf").string(), layers, {num_blocks, block_size});
}

// One instance: a stage server for layers [0, cut) and the engine's own layers after it.
struct pipelined_instance {
  explicit pipelined_instance(int cut) {
    remote_stage = stage_of({0, cut});
    server = std::make_unique<stage_server>(*remote_stage.m, layer_range{0, cut}, stage_server_settings{});
    loaded_stage last = stage_of({cut, 5});
    last_loaded = std::move(last.loaded);
    pipelined = std::shared_ptr<model>(
        make_pipelined_model(std::move(last.m), {cut, 5}, {{server->endpoint(), {0, cut}}}, pipeline_settings{}));
  }
  loaded_stage remote_stage;
  std::unique_ptr<stage_server> server;
  std::unique_ptr<loaded_model> last_loaded;  // outlives `pipelined`, which views its weights
  std::shared_ptr<model> pipelined;
};

kv_connector_settings paired(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  kv_connector_settings settings;
  settings.channel.allow_direct = false;  // plain TCP, as between processes
  settings.transfer_timeout = timeout;
  settings.stage_pairs = true;
  return settings;
}

// A prefill and a decode instance with their connectors, and the prefill's runner sink.
struct instance_pair {
  instance_pair(int prefill_cut, int decode_cut, const kv_connector_settings& settings)
      : prefill(prefill_cut), decode(decode_cut) {
    decode_side = std::make_shared<kv_connector>(decode.pipelined, settings, received.receiver_events());
    prefill_side = std::make_shared<kv_connector>(prefill.pipelined, settings, kv_receiver_events{});
    sink = prefill_side->make_layer_sink();
  }
  pipelined_instance prefill, decode;
  event_log received;  // the decode side's
  std::shared_ptr<kv_connector> decode_side, prefill_side;
  std::unique_ptr<kv_layer_sink> sink;
};

class kv_stage_pairs_test : public ::testing::Test {
 protected:
  void SetUp() override { TROUPE_REQUIRE_SHARED_MODEL(stories260k_dir / "hf"); }

  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 300, 311, 322};
  const std::vector<int32_t> prefill_blocks = {0, 1, 2};
  const std::vector<int32_t> decode_blocks = {9, 5, 12};
  int num_tokens() const { return static_cast<int>(prompt.size()); }

  kv_reservation reservation(uint64_t transfer_id) const {
    return kv_reservation{request_id, transfer_id, decode_blocks, num_tokens(), "prefill"};
  }

  // The prompt through the prefill pipeline in two chunks, each layer streamed into `sink` as
  // the forward writes it.
  void prefill_prompt(model& m, kv_layer_sink& sink) {
    const std::vector<int> cuts = {0, 6, num_tokens()};
    std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const step_plan plan = prefill_step(request_id, prompt, prefill_blocks, cuts[i], cuts[i + 1], i == 1);
      ASSERT_TRUE(sink.prepare(plan, {&prefill_blocks}));
      forward_batch batch = one_sequence_batch(prompt, cuts[i], cuts[i + 1], prefill_blocks, block_size);
      batch.after_layer_kv = [&](int layer) { sink.on_layer_written(layer); };
      m.forward(batch, logits.data());
      sink.finish_step();
    }
  }
};

TEST_F(kv_stage_pairs_test, each_stage_sends_its_layers_to_its_peer_and_the_decode_computes_the_whole_model) {
  instance_pair pair(2, 2, paired());
  auto& [prefill, decode, received, decode_side, prefill_side, sink] = pair;

  const kv_destination where = decode_side->expect(reservation(7), std::chrono::seconds(60));
  ASSERT_EQ(where.stage_routes.size(), 1u);
  EXPECT_EQ(where.stage_routes[0].layers, (layer_range{0, 2}));
  EXPECT_TRUE(where.stage_routes[0].endpoint.starts_with("kvtcp://")) << where.stage_routes[0].endpoint;
  EXPECT_EQ(decode.server->kv_pair_stats().leases, 1u);

  sink->start(request_id, 7);
  prefill_side->send_to(where);
  prefill_prompt(*prefill.pipelined, *sink);
  const auto done = received.wait_for(7);
  ASSERT_TRUE(done);
  ASSERT_TRUE(done->completed) << done->why;

  // Layers 0-1 went stage to stage, one frame per chunk; nothing was exported or imported over
  // the engines' links.
  const stage_kv_pairs_stats took = decode.server->kv_pair_stats();
  // The prefill stage's sender counts a frame once its write returned, which may be after the
  // decode side had it.
  EXPECT_TRUE(eventually([&] { return prefill.server->kv_pair_stats().bytes_pushed == took.bytes_received; }))
      << prefill.server->kv_pair_stats().bytes_pushed << " pushed, " << took.bytes_received << " received";
  EXPECT_GT(took.bytes_received, 0u);
  EXPECT_EQ(took.frames_received, 2u);
  EXPECT_EQ(took.relays, 1u);
  EXPECT_EQ(took.leases, 0u);
  EXPECT_EQ(prefill.server->kv_frames(), 2u) << "two pushes, no export";
  EXPECT_EQ(decode.server->kv_frames(), 1u) << "one lease, no import";
  EXPECT_EQ(decode_side->leases().num_expected, 0);

  // The decode's next token reads every layer's KV: the whole model's logits (its prompt in the
  // same two chunks).
  loaded_stage whole = stage_of({});
  const int vocab = whole.m->config().vocab_size;
  std::vector<float> expected(static_cast<size_t>(vocab)), got(static_cast<size_t>(vocab));
  whole.m->forward(one_sequence_batch(prompt, 0, 6, prefill_blocks, block_size), expected.data());
  whole.m->forward(one_sequence_batch(prompt, 6, num_tokens(), prefill_blocks, block_size), expected.data());
  std::vector<int32_t> next = prompt;
  next.push_back(argmax(expected.data(), vocab));
  whole.m->forward(one_sequence_batch(next, num_tokens(), num_tokens() + 1, prefill_blocks, block_size),
                   expected.data());
  decode.pipelined->forward(one_sequence_batch(next, num_tokens(), num_tokens() + 1, decode_blocks, block_size),
                            got.data());
  EXPECT_EQ(got, expected);
}

TEST_F(kv_stage_pairs_test, a_released_lease_takes_nothing_more_and_the_engine_hears_nothing) {
  instance_pair pair(2, 2, paired());
  auto& [prefill, decode, received, decode_side, prefill_side, sink] = pair;

  const kv_destination where = decode_side->expect(reservation(8), std::chrono::seconds(60));
  decode_side->cancel(8);  // the request ended on the decode side: its blocks go back
  EXPECT_EQ(decode.server->kv_pair_stats().leases, 0u);
  sink->start(request_id, 8);
  prefill_side->send_to(where);
  prefill_prompt(*prefill.pipelined, *sink);
  // Both chunks reach the decode stage, which refuses them: no lease names the transfer.
  EXPECT_TRUE(eventually([&] { return decode.server->kv_pair_stats().frames_refused == 2; }))
      << decode.server->kv_pair_stats().frames_refused;
  EXPECT_EQ(decode.server->kv_pair_stats().frames_received, 0u);
  EXPECT_EQ(received.count(8), 0u) << "a cancelled transfer reports nothing";
}

TEST_F(kv_stage_pairs_test, a_decode_cut_otherwise_is_refused_by_the_prefill_by_name) {
  instance_pair pair(2, 3, paired());
  auto& [prefill, decode, received, decode_side, prefill_side, sink] = pair;
  const auto start = std::chrono::steady_clock::now();
  const kv_destination where = decode_side->expect(reservation(9), std::chrono::seconds(60));
  ASSERT_EQ(where.stage_routes.size(), 1u);
  EXPECT_EQ(where.stage_routes[0].layers, (layer_range{0, 3}));
  sink->start(request_id, 9);
  prefill_side->send_to(where);
  const step_plan plan = prefill_step(request_id, prompt, prefill_blocks, 0, num_tokens(), true);
  EXPECT_FALSE(sink->prepare(plan, {&prefill_blocks})) << "the stream broke: nothing to stream";
  // The prefill gives the transfer up, saying why: the decode's lease fails at once, not at its
  // deadline, and its stage's lease is released with it.
  const auto done = received.wait_for(9);
  ASSERT_TRUE(done);
  EXPECT_FALSE(done->completed);
  EXPECT_NE(done->why.find("its sender gave it up: the pipelines are not cut alike (the decode's stage 0 holds "
                           "layers 0-2, this prefill's 0-1)"),
            std::string::npos)
      << done->why;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_TRUE(eventually([&] { return decode.server->kv_pair_stats().leases == 0; }));
}

}  // namespace
}  // namespace troupe::test

namespace troupe::test {
namespace {

// A decode stage that goes away takes its leases with it: the transfers waiting for its relay
// fail as soon as the engine notices, not at their deadline.
TEST_F(kv_stage_pairs_test, a_lost_decode_stage_fails_the_transfers_it_held_at_once) {
  pipelined_instance decode(2);
  event_log received;
  auto decode_side = std::make_shared<kv_connector>(decode.pipelined, paired(), received.receiver_events());
  const auto start = std::chrono::steady_clock::now();
  const kv_destination where = decode_side->expect(reservation(10), std::chrono::seconds(60));
  ASSERT_EQ(where.stage_routes.size(), 1u);
  decode.server.reset();  // the stage's process is gone
  const auto done = received.wait_for(10, std::chrono::seconds(10));
  ASSERT_TRUE(done) << "the transfer waited for its deadline";
  EXPECT_FALSE(done->completed);
  EXPECT_NE(done->why.find("a pipeline stage of this decode instance was lost"), std::string::npos) << done->why;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(decode_side->leases().num_expected, 0);
}

}  // namespace
}  // namespace troupe::test
