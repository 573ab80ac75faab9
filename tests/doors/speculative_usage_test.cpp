// Speculative decoding's figures as the doors report them: one request's and a sum's (choices of
// an HTTP request, the server's life), the final ZeroMQ reply's usage, the OpenAI usage of a
// whole response and of a stream's usage chunk, each with drafts and without, and /metrics.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "doors/http/generation_session.hpp"
#include "doors/http/metrics_text.hpp"
#include "doors/serving_metrics.hpp"
#include "doors/speculative_usage.hpp"
#include "doors/zmq_request_table.hpp"

namespace troupe {
namespace {

using nlohmann::json;

// A request that ran `steps` sampling steps here with `drafts` drafts verified, `accepted` of
// them kept, and `outputs` output tokens in all.
request_metrics spec_metrics(int outputs, int steps, int drafts, int accepted) {
  request_metrics m;
  m.num_prompt_tokens = 5;
  m.num_output_tokens = outputs;
  m.num_sampling_steps = steps;
  m.num_draft_tokens = drafts;
  m.num_accepted_tokens = accepted;
  return m;
}

text_delta final_delta(int64_t request_id, const request_metrics& m, const std::string& text = "end") {
  text_delta d;
  d.delta.request_id = request_id;
  d.delta.token_ids = {7};
  d.delta.finish = finish_reason::length;
  d.delta.metrics = m;
  d.text = text;
  return d;
}

TEST(speculative_usage, one_requests_rate_and_tokens_per_step) {
  // 20 outputs in 8 steps: 8 sampled + 12 accepted drafts of 16.
  auto u = speculative_usage_of(spec_metrics(20, 8, 16, 12));
  ASSERT_TRUE(u);
  EXPECT_EQ(u->draft_tokens, 16);
  EXPECT_EQ(u->accepted_tokens, 12);
  EXPECT_DOUBLE_EQ(u->acceptance_rate, 0.75);
  EXPECT_DOUBLE_EQ(u->tokens_per_step, 2.5);
}

TEST(speculative_usage, none_without_drafts) {
  EXPECT_FALSE(speculative_usage_of(spec_metrics(10, 10, 0, 0)));  // speculation off
  EXPECT_FALSE(speculative_usage_of(request_metrics{}));           // aborted in the queue
}

TEST(speculative_usage, outputs_generated_elsewhere_do_not_count_toward_tokens_per_step) {
  // Resumed after failover with 30 outputs already streamed; here 10 steps kept 10 + 5 tokens.
  EXPECT_EQ(num_generated_here(spec_metrics(45, 10, 8, 5)), 15);
  EXPECT_DOUBLE_EQ(speculative_usage_of(spec_metrics(45, 10, 8, 5))->tokens_per_step, 1.5);
  // A stop string cut the last step's accepted drafts: the outputs are what was kept.
  EXPECT_EQ(num_generated_here(spec_metrics(12, 5, 12, 9)), 12);
  EXPECT_DOUBLE_EQ(speculative_usage_of(spec_metrics(12, 5, 12, 9))->tokens_per_step, 12.0 / 5);
}

TEST(speculative_usage, a_tally_sums_requests_before_dividing) {
  speculative_tally t;
  t.add(spec_metrics(20, 8, 16, 12));
  t.add(spec_metrics(4, 4, 0, 0));  // no drafts: its steps still count
  t.add(spec_metrics(9, 3, 8, 6));
  EXPECT_EQ(t.num_draft_tokens, 24u);
  EXPECT_EQ(t.num_accepted_tokens, 18u);
  EXPECT_EQ(t.num_sampling_steps, 15u);
  EXPECT_EQ(t.num_generated_tokens, 33u);
  EXPECT_DOUBLE_EQ(t.acceptance_rate(), 0.75);
  EXPECT_DOUBLE_EQ(t.tokens_per_step(), 33.0 / 15);
  EXPECT_DOUBLE_EQ(speculative_tally{}.acceptance_rate(), 0.0);
  EXPECT_DOUBLE_EQ(speculative_tally{}.tokens_per_step(), 0.0);
}

TEST(speculative_usage, the_zmq_final_reply_carries_it_only_with_drafts) {
  request_admission admission(8);
  zmq_request_table table(admission, 100);
  generate_request spec, plain;
  spec.id = "spec";
  spec.prompt = plain.prompt = "Once";
  spec.sampling.num_speculative_tokens = 4;
  plain.id = "plain";
  plain.stream = false;  // the gathered reply keeps the final's usage too
  auto a = table.on_request("peer", spec, 1);
  auto b = table.on_request("peer", plain, 1);
  ASSERT_TRUE(a.submit && b.submit);
  EXPECT_EQ(a.submit->sampling.num_speculative_tokens, 4);  // the field reaches the stages
  auto out = table.on_event(text_batch{{final_delta(a.submit->request_id, spec_metrics(20, 8, 16, 12)),
                                        final_delta(b.submit->request_id, spec_metrics(6, 6, 0, 0))}},
                            2);
  ASSERT_EQ(out.replies.size(), 2u);
  const auto& with = std::get<delta_reply>(out.replies[0].reply);
  const auto& without = std::get<delta_reply>(out.replies[1].reply);
  ASSERT_EQ(with.id, "spec");
  ASSERT_TRUE(with.usage && with.usage->speculative);
  EXPECT_EQ(with.usage->speculative->draft_tokens, 16);
  EXPECT_EQ(with.usage->speculative->accepted_tokens, 12);
  EXPECT_DOUBLE_EQ(with.usage->speculative->acceptance_rate, 0.75);
  EXPECT_DOUBLE_EQ(with.usage->speculative->tokens_per_step, 2.5);
  ASSERT_EQ(without.id, "plain");
  ASSERT_TRUE(without.usage);
  EXPECT_FALSE(without.usage->speculative);
}

openai_request completion_request(int n, bool stream) {
  openai_request r;
  r.model = "m";
  openai_prompt p;
  p.text = "A";
  r.prompts = {p};
  r.n = n;
  r.stream = stream;
  r.include_usage = stream;
  return r;
}

std::string token_text(int32_t id) { return "t" + std::to_string(id); }

TEST(speculative_usage, the_openai_usage_sums_every_choice) {
  generation_session session(completion_request(2, false), 2, 1000, token_text);
  session.apply({0, final_delta(session.request_id(0), spec_metrics(20, 8, 16, 12))});
  session.apply({1, final_delta(session.request_id(1), spec_metrics(9, 3, 8, 6))});
  ASSERT_TRUE(session.all_finished());
  const json usage = json::parse(session.full_body()).at("usage");
  EXPECT_EQ(usage.at("completion_tokens"), 29);
  EXPECT_EQ(
      usage.at("speculative"),
      (json{{"draft_tokens", 24}, {"accepted_tokens", 18}, {"acceptance_rate", 0.75}, {"tokens_per_step", 29.0 / 11}}));
}

TEST(speculative_usage, the_openai_usage_has_no_speculative_object_without_drafts) {
  generation_session session(completion_request(1, false), 2, 1000, token_text);
  session.apply({0, final_delta(session.request_id(0), spec_metrics(6, 6, 0, 0))});
  const json usage = json::parse(session.full_body()).at("usage");
  EXPECT_EQ(usage, (json{{"prompt_tokens", 5}, {"completion_tokens", 6}, {"total_tokens", 11}}));
}

TEST(speculative_usage, the_streams_usage_chunk_carries_it) {
  generation_session session(completion_request(1, true), 2, 1000, token_text);
  session.apply({0, final_delta(session.request_id(0), spec_metrics(20, 8, 16, 12))});
  const std::string text = session.take_stream_text();
  ASSERT_TRUE(session.stream_ended());
  // The events: the final chunk, the usage chunk, [DONE].
  const size_t usage_at = text.find("\"usage\":{");
  ASSERT_NE(usage_at, std::string::npos) << text;
  const size_t start = text.rfind("data: ", usage_at) + 6;
  const json chunk = json::parse(text.substr(start, text.find("\n\n", start) - start));
  EXPECT_TRUE(chunk.at("choices").empty());
  EXPECT_EQ(chunk.at("usage").at("speculative").at("draft_tokens"), 16);
  EXPECT_EQ(chunk.at("usage").at("speculative").at("accepted_tokens"), 12);
  EXPECT_DOUBLE_EQ(chunk.at("usage").at("speculative").at("tokens_per_step").get<double>(), 2.5);
}

TEST(speculative_usage, serving_metrics_count_finished_requests_and_metrics_text_shows_them) {
  serving_metrics metrics;
  metrics.arrived(1, 0);
  metrics.arrived(2, 0);
  metrics.arrived(3, 0);
  auto record = metrics.observe(final_delta(1, spec_metrics(20, 8, 16, 12)), 1'000'000);
  ASSERT_TRUE(record);
  EXPECT_EQ(record->num_draft_tokens, 16);  // the trace keeps them
  EXPECT_EQ(record->num_accepted_tokens, 12);
  metrics.observe(final_delta(2, spec_metrics(6, 6, 0, 0)), 2'000'000);
  metrics.observe(final_delta(3, spec_metrics(9, 3, 8, 6)), 3'000'000);
  const serving_metrics_snapshot s = metrics.snapshot();
  EXPECT_EQ(s.speculative.num_draft_tokens, 24u);
  EXPECT_EQ(s.speculative.num_accepted_tokens, 18u);
  EXPECT_EQ(s.speculative.num_sampling_steps, 17u);  // all three requests' steps
  EXPECT_EQ(s.tokens_per_step.count(), 2u);          // only the two that had drafts
  EXPECT_DOUBLE_EQ(s.tokens_per_step.sum(), 2.5 + 3.0);

  metrics_snapshot m;
  m.model_name = "m";
  m.serving = s;
  const std::string text = render_metrics(m);
  for (const char* line :
       {"# TYPE troupe_spec_draft_tokens_total counter\n", "troupe_spec_draft_tokens_total 24\n",
        "# TYPE troupe_spec_accepted_tokens_total counter\n", "troupe_spec_accepted_tokens_total 18\n",
        "# TYPE troupe_spec_sampling_steps_total counter\n", "troupe_spec_sampling_steps_total 17\n",
        "# TYPE troupe_spec_acceptance_rate gauge\n", "troupe_spec_acceptance_rate 0.75\n",
        "# TYPE troupe_spec_tokens_per_step histogram\n", "troupe_spec_tokens_per_step_bucket{le=\"2\"} 0\n",
        "troupe_spec_tokens_per_step_bucket{le=\"2.5\"} 1\n", "troupe_spec_tokens_per_step_bucket{le=\"3\"} 2\n",
        "troupe_spec_tokens_per_step_bucket{le=\"+Inf\"} 2\n", "troupe_spec_tokens_per_step_count 2\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
  for (const char* family :
       {"troupe_spec_draft_tokens_total", "troupe_spec_accepted_tokens_total", "troupe_spec_sampling_steps_total",
        "troupe_spec_acceptance_rate", "troupe_spec_tokens_per_step"}) {
    EXPECT_NE(text.find(std::string("# HELP ") + family + " "), std::string::npos) << family;
  }
  // A server that never speculated says so with zeros, not with missing series.
  const std::string idle = render_metrics(metrics_snapshot{});
  EXPECT_NE(idle.find("troupe_spec_draft_tokens_total 0\n"), std::string::npos);
  EXPECT_NE(idle.find("troupe_spec_acceptance_rate 0\n"), std::string::npos);
}

}  // namespace
}  // namespace troupe
