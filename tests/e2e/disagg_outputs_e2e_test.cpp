// Prefill/decode disaggregation answers like one process: the same 200 requests (greedy and
// seeded, streamed and not, ZeroMQ and HTTP, prompts sharing prefixes so the prefill side's cache
// hits) through a 1P1D and a 2P1D topology (`troupe launch`, every node its own process), and
// through a 1P1D whose prefill is cut into 8-token chunks, give the outputs of a colocated
// `troupe serve`: text, token ids, finish reason, usage; and so does a 1P1D whose decode side
// verifies n-gram drafts (speculative decoding), and a Q8_0 model with its default f16 cache. Every node must have done its share, and
// once idle no instance holds a block, a reservation or an open transfer.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "model/model_maker.hpp"
#include "tests/e2e/cluster_fixture.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

// Long enough that most prompts fill a KV block or more, so the prefix cache and chunking have
// something to do; several share their first sentence.
const std::vector<std::string> prompts = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun",
    "Once upon a time, there was a little girl named Lily. She had a big red ball",
    "The little dog ran to the park",
    "Lily and Tom went to the park. They saw a big tree with a swing. Tom wanted to swing first",
    "One day, a bird",
    "Tim had a red ball. He liked to play with it every day. One day, the ball rolled away"};

constexpr size_t wave = 20;

class disagg_outputs_e2e : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories_root / "refs.json");
    make_credentials(dir_ / "certs", {"controller", "prefill-a", "prefill-b", "decode-a"});
  }

  std::vector<outcome> colocated_outputs(const std::string& model, const std::vector<mixed_request>& mix) {
    topology_spec colocated;
    colocated.model_path = model;
    controller_process reference(controller_process::kind::serve, colocated.write(dir_ / "colocated.toml"),
                                 dir_ / "colocated.log");
    std::vector<outcome> expected = run_in_waves(reference, mix, wave);
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(expected[i].error, "") << "reference " << i;
    return expected;
  }

  topology_spec disaggregated(const std::string& model, int num_prefill) {
    topology_spec t;
    t.model_path = model;
    t.credentials = dir_ / "certs";
    t.nodes = {{"prefill-a", free_port()}, {"decode-a", free_port()}};
    t.prefill = {"prefill-a"};
    if (num_prefill == 2) {
      t.nodes.push_back({"prefill-b", free_port()});
      t.prefill.push_back("prefill-b");
    }
    t.decode = {"decode-a"};
    t.engines = {};
    return t;
  }

  void expect_equal_outputs(const std::string& name, const topology_spec& topology,
                            const std::vector<mixed_request>& mix, const std::vector<outcome>& expected,
                            const std::map<std::string, long>& busy) {
    expect_launch_answers_like(dir_.path(), name, topology, mix, expected, busy, wave);
  }

  scratch_dir dir_;
};

TEST_F(disagg_outputs_e2e, stories260k_through_1p1d_2p1d_and_small_chunks_equals_one_process) {
  const std::vector<mixed_request> mix = request_mix(200, prompts, 8, 64, true, 3);
  const std::vector<outcome> expected = colocated_outputs(stories_dir, mix);
  ASSERT_FALSE(HasFailure());

  expect_equal_outputs("1p1d", disaggregated(stories_dir, 1), mix, expected,
                       {{"prefill-a", 8192}, {"decode-a", 32768}});
  expect_equal_outputs("2p1d", disaggregated(stories_dir, 2), mix, expected,
                       {{"prefill-a", 2048}, {"prefill-b", 2048}, {"decode-a", 32768}});
  topology_spec chunked = disaggregated(stories_dir, 1);
  chunked.max_num_batched_tokens = 8;  // every prompt streams out chunk by chunk
  expect_equal_outputs("1p1d-chunked", chunked, mix, expected, {{"prefill-a", 8192}, {"decode-a", 32768}});

  // Speculative decoding on the decode side changes no output: the greedy requests draft by
  // n-gram prompt lookup (asked per request, through both doors; most also by the topology's
  // default), the seeded ones turn it off per request and keep their exact samples.
  std::vector<mixed_request> speculating = mix;
  for (size_t i = 0; i < speculating.size(); ++i) {
    sampling_params& p = speculating[i].request.sampling;
    p.num_speculative_tokens = p.seed ? 0 : i % 5 == 0 ? -1 : static_cast<int>(2 + i % 7);
  }
  topology_spec speculative = disaggregated(stories_dir, 1);
  speculative.num_speculative_tokens = 4;
  expect_equal_outputs("1p1d-speculative", speculative, speculating, expected,
                       {{"prefill-a", 8192}, {"decode-a", 32768}});
}

// A quantized model keeps its KV in f16 by default (its every layer product and its attention
// give a token the same bits however the step was batched or cut), and a 1P1D pair, its prompts
// whole or in 8-token chunks, still answers bit for bit as one process: a random Llama made in
// Q8_0 with stories260K's tokenizer (every matrix in Q8_0: stories260K itself keeps its 172-wide
// down projections in f16, whose float products sum differently below and above 32 rows), the
// 200-request mix, seeded requests included. Its near-uniform logits make any last-bit
// difference show as a different token.
TEST_F(disagg_outputs_e2e, a_q8_0_model_with_its_default_f16_cache_through_1p1d_equals_one_process) {
  model_maker_options options;
  options.arch = "llama";
  options.hidden_size = 128;
  options.intermediate_size = 256;
  options.num_layers = 2;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  options.type = dtype::q8_0;
  options.seed = 5;
  options.init_stddev = 0.05f;
  options.tokenizer = stories_dir;
  options.out = dir_ / "random-q8_0";
  const std::string model = make_model(options).gguf_path.string();
  const std::vector<mixed_request> mix = request_mix(200, prompts, 8, 64, true, 3);
  const std::vector<outcome> expected = colocated_outputs(model, mix);
  ASSERT_FALSE(HasFailure());
  expect_equal_outputs("1p1d-q8_0", disaggregated(model, 1), mix, expected, {{"prefill-a", 8192}, {"decode-a", 32768}});
  topology_spec chunked = disaggregated(model, 1);
  chunked.max_num_batched_tokens = 8;
  expect_equal_outputs("1p1d-q8_0-chunked", chunked, mix, expected, {{"prefill-a", 8192}, {"decode-a", 32768}});
}

// The two sides keep their KV in different dtypes: the frames carry the prefill side's and the
// decode side converts on import. Each 1P1D answers like one process whose cache has the decode
// side's dtype: an f32 prefill into a decode on its default (f32 since the f16 default applies to
// quantized models only: a rewrite must name f16 on the decode side and the reference), and an
// f16 prefill into an fp8_e4m3 decode against a colocated fp8_e4m3 server.
// Disabled: the claim does not hold bit for bit. The prefill side's own attention reads its f32
// (or f16) cache while the colocated reference reads the decode side's dtype, so the prompt's
// later layers and its first sampled token differ in the last bits, and seeded sampling
// diverges (measured: request 8 of 60 differs). To be rewritten to what holds: every request
// answered, and the logits within the dtype's rounding of the reference's.
TEST_F(disagg_outputs_e2e, DISABLED_prefill_and_decode_with_different_kv_dtypes_equal_one_process) {
  const std::vector<mixed_request> mix = request_mix(60, prompts, 8, 48, true, 5);
  const std::vector<outcome> expected = colocated_outputs(stories_dir, mix);
  ASSERT_FALSE(HasFailure());
  topology_spec wide_prefill = disaggregated(stories_dir, 1);
  wide_prefill.nodes[0].kv_cache_dtype = "f32";
  expect_equal_outputs("1p1d-f32-to-f16", wide_prefill, mix, expected, {{"prefill-a", 2048}, {"decode-a", 8192}});

  std::vector<outcome> expected_fp8;
  {
    topology_spec colocated_fp8;
    colocated_fp8.model_path = stories_dir;
    colocated_fp8.kv_cache_dtype = "fp8_e4m3";
    controller_process reference(controller_process::kind::serve, colocated_fp8.write(dir_ / "colocated-fp8.toml"),
                                 dir_ / "colocated-fp8.log");
    expected_fp8 = run_in_waves(reference, mix, wave);
  }
  for (size_t i = 0; i < expected_fp8.size(); ++i) EXPECT_EQ(expected_fp8[i].error, "") << "fp8 reference " << i;
  topology_spec narrow_decode = disaggregated(stories_dir, 1);
  narrow_decode.nodes[1].kv_cache_dtype = "fp8_e4m3";
  expect_equal_outputs("1p1d-f16-to-fp8", narrow_decode, mix, expected_fp8, {{"prefill-a", 2048}, {"decode-a", 8192}});
}

// prompt_logprobs are computed where the prompt is, on the prefill side (in 8-token chunks here),
// and travel with the first token to the reply the decode side finishes: the same positions,
// tokens and (within the two sides' KV dtypes' rounding) logprobs as one process gives.
TEST_F(disagg_outputs_e2e, prompt_logprobs_travel_from_the_prefill_side_as_one_process_gives_them) {
  auto ask = [&](const controller_process& server, bool stream) {
    generate_request r;
    r.prompt = prompts[3];
    r.stream = stream;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 6;
    r.sampling.prompt_logprobs = 3;
    std::vector<prompt_logprob> got;
    int num_carrying = 0;
    const completion done = server.make_client().generate(r, [&](const delta_reply& d) {
      if (!d.prompt_logprobs) return;
      ++num_carrying;
      got = *d.prompt_logprobs;
    });
    EXPECT_EQ(num_carrying, 1);
    EXPECT_EQ(got.size(), static_cast<size_t>(done.usage.prompt_tokens - 1));
    return std::make_pair(done.token_ids, got);
  };
  topology_spec colocated;
  colocated.model_path = stories_dir;
  colocated.max_num_batched_tokens = 8;
  controller_process reference(controller_process::kind::serve, colocated.write(dir_ / "colocated.toml"),
                               dir_ / "colocated.log");
  const auto expected = ask(reference, true);
  ASSERT_GT(expected.second.size(), 16u) << "a prompt of several chunks and blocks";
  topology_spec pair = disaggregated(stories_dir, 1);
  pair.max_num_batched_tokens = 8;
  controller_process launch(controller_process::kind::launch, pair.write(dir_ / "1p1d.toml"), dir_ / "1p1d.log");
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    const auto got = ask(launch, stream);
    EXPECT_EQ(got.first, expected.first);
    ASSERT_EQ(got.second.size(), expected.second.size());
    for (size_t i = 0; i < got.second.size(); ++i) {
      EXPECT_EQ(got.second[i].token_id, expected.second[i].token_id) << "position " << i + 1;
      EXPECT_NEAR(got.second[i].logprob, expected.second[i].logprob, 2e-2f) << "position " << i + 1;
      ASSERT_EQ(got.second[i].top.size(), 3u);
      EXPECT_NEAR(got.second[i].top[0].second, expected.second[i].top[0].second, 2e-2f) << "position " << i + 1;
    }
  }
  if (HasFailure()) ADD_FAILURE() << launch.log();
}

TEST_F(disagg_outputs_e2e, a_12_layer_model_through_1p1d_equals_one_process) {
  const fs::path model = dir_ / "model-12";
  const run_result made = run_troupe("make-model --layers 12 --seed 12 --tokenizer " + shell_quote(stories_dir) +
                                     " --out " + shell_quote(model.string()));
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::vector<mixed_request> mix = request_mix(60, prompts, 8, 48, true, 4);
  const std::vector<outcome> expected = colocated_outputs(model.string(), mix);
  ASSERT_FALSE(HasFailure());
  expect_equal_outputs("1p1d-12-layer", disaggregated(model.string(), 1), mix, expected,
                       {{"prefill-a", 2048}, {"decode-a", 8192}});
}

}  // namespace
}  // namespace troupe::test::cluster
