// Prefill/decode disaggregation answers like one process: the same 200 requests (greedy and
// seeded, streamed and not, ZeroMQ and HTTP, prompts sharing prefixes so the prefill side's cache
// hits) through a 1P1D and a 2P1D topology (`troupe launch`, every node its own process), and
// through a 1P1D whose prefill is cut into 8-token chunks, give the outputs of a colocated
// `troupe serve`: text, token ids, finish reason, usage; and so does a 1P1D whose decode side
// verifies n-gram drafts (speculative decoding), and a Q8_0 model with its default f16 cache.
// Every node must have done its share, and once idle no instance holds a block, a reservation or
// an open transfer. A pair whose sides keep different KV dtypes answers within the dtype's
// rounding of one process.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
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
// decode side converts on import. Bit equality with one process cannot hold here: the prefill
// side's own attention reads its dtype while a colocated reference reads the decode side's, so
// the prompt's later layers differ in the last bits (measured when this was claimed: 1 request of
// 60 sampled a different token). What holds, and is checked against a colocated server with the
// decode side's dtype: every request of a mix (greedy and seeded, streamed and not, both doors)
// is answered in full and nothing stays held; and each greedy answer has the reference's tokens
// up to the reference's first near-tie (its two best logprobs within `tolerance`), with every
// chosen token's logprob up to there within `tolerance` of the reference's. `tolerance` is the
// cache dtype's rounding carried to the logprobs: f16 measured at most 5e-3 here, so 1e-2; bf16
// keeps 3 mantissa bits fewer, 8x that (measured 3.3e-2). (fp8_e4m3 on this model moves the first
// token itself, whichever side computes it: no closeness to claim; q8_0 needs head_dim 32.)
struct greedy_answer {
  std::vector<int32_t> token_ids;
  std::vector<token_logprob> logprobs;
};

std::vector<greedy_answer> greedy_answers(const controller_process& server, const std::vector<std::string>& texts) {
  std::vector<greedy_answer> answers;
  for (const std::string& text : texts) {
    generate_request r;
    r.prompt = text;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 48;
    r.sampling.logprobs = 2;
    greedy_answer a;
    const completion done = server.make_client().generate(r, [&](const delta_reply& d) {
      if (d.logprobs) a.logprobs.insert(a.logprobs.end(), d.logprobs->begin(), d.logprobs->end());
    });
    a.token_ids = done.token_ids;
    answers.push_back(std::move(a));
  }
  return answers;
}

// Checks `got` against `expected` as the comment above says; keeps the largest logprob
// difference seen and counts the tokens compared.
void expect_close_to(const std::vector<greedy_answer>& got, const std::vector<greedy_answer>& expected, float tolerance,
                     float& largest, size_t& num_compared) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    const greedy_answer& want = expected[i];
    ASSERT_EQ(want.logprobs.size(), want.token_ids.size());
    ASSERT_EQ(got[i].logprobs.size(), got[i].token_ids.size());
    for (size_t t = 0; t < want.token_ids.size(); ++t) {
      ASSERT_LT(t, got[i].token_ids.size()) << "the answer ended early";
      ASSERT_EQ(got[i].token_ids[t], want.token_ids[t]) << "token " << t;
      const float difference = std::abs(got[i].logprobs[t].logprob - want.logprobs[t].logprob);
      EXPECT_LE(difference, tolerance) << "token " << t;
      largest = std::max(largest, difference);
      ++num_compared;
      const auto& top = want.logprobs[t].top;
      // A near-tie: two logprobs that may each move by `tolerance` may change places.
      if (top.size() == 2 && top[0].second - top[1].second <= 2 * tolerance) break;
    }
  }
}

// Whether an engine's start line names `dtype` as its KV cache's: the backend's name in it reads
// "cpu (avx2, 2 threads, KV f16, OpenBLAS Haswell)", the dtype followed by a comma or the end.
bool names_kv_dtype(const std::string& line, const std::string& dtype) {
  return line.find("KV " + dtype + ",") != std::string::npos || line.find("KV " + dtype + ")") != std::string::npos;
}

TEST_F(disagg_outputs_e2e, prefill_and_decode_with_different_kv_dtypes_answer_like_one_process_within_the_dtype) {
  const std::vector<mixed_request> mix = request_mix(60, prompts, 8, 48, true, 5);
  struct pairing {
    std::string name, prefill_dtype, decode_dtype;
    float tolerance;
  };
  for (const pairing& p : {pairing{"f32-to-f16", "f32", "f16", 1e-2f}, pairing{"f16-to-bf16", "f16", "bf16", 8e-2f}}) {
    SCOPED_TRACE(p.name);
    std::vector<greedy_answer> expected;
    {
      topology_spec colocated;
      colocated.model_path = stories_dir;
      colocated.kv_cache_dtype = p.decode_dtype;
      controller_process reference(controller_process::kind::serve,
                                   colocated.write(dir_ / (p.name + "-colocated.toml")),
                                   dir_ / (p.name + "-colocated.log"));
      expected = greedy_answers(reference, prompts);
    }
    topology_spec pair = disaggregated(stories_dir, 1);
    pair.nodes[0].kv_cache_dtype = p.prefill_dtype;
    pair.nodes[1].kv_cache_dtype = p.decode_dtype;
    controller_process launch(controller_process::kind::launch, pair.write(dir_ / (p.name + ".toml")),
                              dir_ / (p.name + ".log"));
    // Each side runs its own dtype (the engine's start line names it).
    EXPECT_GE(count_of(launch.log(), "(prefill): "), 1) << launch.log();
    std::istringstream log(launch.log());
    for (std::string line; std::getline(log, line);) {
      if (line.find("(prefill): ") != std::string::npos) {
        EXPECT_TRUE(names_kv_dtype(line, p.prefill_dtype)) << line;
      }
      if (line.find("(decode): ") != std::string::npos) {
        EXPECT_TRUE(names_kv_dtype(line, p.decode_dtype)) << line;
      }
    }
    size_t num_compared = 0;
    float largest = 0.0f;
    expect_close_to(greedy_answers(launch, prompts), expected, p.tolerance, largest, num_compared);
    std::printf("[ %s ] %zu greedy tokens compared, largest logprob difference %.2e (tolerance %.0e)\n", p.name.c_str(),
                num_compared, largest, p.tolerance);
    EXPECT_GE(num_compared, 60u) << "too few tokens before a near-tie to say anything";

    const std::vector<outcome> got = run_in_waves(launch, mix, wave);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].error, "") << "request " << i;
      EXPECT_FALSE(got[i].finish_reason.empty()) << "request " << i;
    }
    const stats_reply idle = wait_until_idle(launch);
    EXPECT_EQ(idle.num_free_blocks, idle.num_total_blocks) << "a KV block left taken";
    EXPECT_EQ(idle.num_kv_leases, 0) << "a KV transfer left open";
    EXPECT_EQ(idle.num_requests_in_flight, 0);
    if (HasFailure()) ADD_FAILURE() << launch.log();
  }
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
