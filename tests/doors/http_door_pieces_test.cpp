// The HTTP door's plain pieces: shared admission (ids carry their door, all-or-nothing slots),
// the reply router, a generation session turning engine events into OpenAI bodies and SSE, and
// the metrics text.

#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "doors/http/anthropic_response.hpp"
#include "doors/http/generation_session.hpp"
#include "doors/http/metrics_text.hpp"
#include "doors/reply_router.hpp"
#include "doors/request_admission.hpp"

namespace troupe {
namespace {

using json = nlohmann::json;

TEST(request_admission, ids_carry_their_door_and_never_collide) {
  request_admission admission(100);
  std::set<int64_t> seen;
  for (int i = 0; i < 10; ++i) {
    for (auto door : {client_door::zmq, client_door::http}) {
      auto first = admission.admit(door, 3);
      ASSERT_TRUE(first);
      for (int k = 0; k < 3; ++k) {
        const int64_t id = request_admission::nth_id(*first, k);
        EXPECT_EQ(request_admission::door_of(id), door);
        EXPECT_TRUE(seen.insert(id).second) << id;
      }
    }
  }
  EXPECT_EQ(admission.num_in_flight(), 60);
  EXPECT_EQ(admission.num_admitted(client_door::http), 30u);
  EXPECT_EQ(request_admission::door_of_tag(admission.next_stats_tag(client_door::http)), client_door::http);
  EXPECT_EQ(request_admission::door_of_tag(admission.next_stats_tag(client_door::zmq)), client_door::zmq);
}

TEST(request_admission, the_bound_is_shared_and_all_or_nothing) {
  request_admission admission(4);
  ASSERT_TRUE(admission.admit(client_door::zmq, 3));
  EXPECT_FALSE(admission.admit(client_door::http, 2));  // would need 5
  EXPECT_EQ(admission.num_in_flight(), 3);
  EXPECT_EQ(admission.num_refused(client_door::http), 1u);
  ASSERT_TRUE(admission.admit(client_door::http, 1));
  EXPECT_FALSE(admission.admit(client_door::zmq));
  admission.release(2);
  EXPECT_TRUE(admission.admit(client_door::http, 2));
}

struct recording_inbox : door_inbox {
  std::vector<door_event> events;
  void post(door_event event) override { events.push_back(std::move(event)); }
};

text_delta delta(int64_t id, std::string text, finish_reason finish = finish_reason::none, int prompt = 0,
                 int output = 0) {
  text_delta d;
  d.delta.request_id = id;
  d.text = std::move(text);
  d.delta.token_ids = {1};
  d.delta.finish = finish;
  if (finish != finish_reason::none) {
    request_metrics m;
    m.num_prompt_tokens = prompt;
    m.num_output_tokens = output;
    d.delta.metrics = m;
  }
  return d;
}

TEST(reply_router, splits_a_batch_by_door_and_counts_finished_requests) {
  request_admission admission(10);
  const int64_t zmq_id = *admission.admit(client_door::zmq);
  const int64_t http_id = *admission.admit(client_door::http);
  recording_inbox zmq, http;
  reply_router router;
  router.set_door(client_door::zmq, &zmq);
  router.set_door(client_door::http, &http);
  text_batch batch;
  batch.deltas = {delta(zmq_id, "a"), delta(http_id, "b", finish_reason::length, 5, 7)};
  router.route(std::move(batch));
  ASSERT_EQ(zmq.events.size(), 1u);
  ASSERT_EQ(http.events.size(), 1u);
  EXPECT_EQ(std::get<text_batch>(zmq.events[0]).deltas[0].text, "a");
  EXPECT_EQ(std::get<text_batch>(http.events[0]).deltas[0].text, "b");
  router.route(request_failed{zmq_id, error_code::internal, "x"});
  router.route(stats_answer{admission.next_stats_tag(client_door::http), 1, 2, 3, 4, {}});
  EXPECT_EQ(zmq.events.size(), 2u);
  EXPECT_EQ(http.events.size(), 2u);
  EXPECT_EQ(router.counters().num_prompt_tokens.load(), 5u);
  EXPECT_EQ(router.counters().num_generation_tokens.load(), 7u);
  EXPECT_EQ(router.counters().num_finished_length.load(), 1u);
  EXPECT_EQ(router.counters().num_failed.load(), 1u);
}

openai_request two_prompts_two_samples(openai_endpoint endpoint, bool stream) {
  openai_request r;
  r.endpoint = endpoint;
  r.model = "m";
  openai_prompt a, b;
  a.text = "A";
  b.text = "B";
  r.prompts = {a, b};
  r.n = 2;
  r.stream = stream;
  r.sampling.seed = 10;
  return r;
}

std::string token_text(int32_t id) { return "t" + std::to_string(id); }

TEST(generation_session, fans_out_choices_with_seeds_and_merges_them_by_index) {
  request_admission admission(10);
  const int64_t first = *admission.admit(client_door::http, 4);
  generation_session session(two_prompts_two_samples(openai_endpoint::completions, false), first, 1000, token_text);
  auto jobs = session.engine_requests();
  ASSERT_EQ(jobs.size(), 4u);
  EXPECT_EQ(jobs[0].prompt, "A");
  EXPECT_EQ(jobs[1].prompt, "A");
  EXPECT_EQ(jobs[2].prompt, "B");
  EXPECT_EQ(*jobs[0].sampling.seed, 10u);
  EXPECT_EQ(*jobs[1].sampling.seed, 11u);
  EXPECT_EQ(*jobs[2].sampling.seed, 10u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(jobs[static_cast<size_t>(i)].request_id, session.request_id(i));
  // Events arrive interleaved; choices are put together by index.
  session.apply({3, delta(jobs[3].request_id, "b2")});
  session.apply({0, delta(jobs[0].request_id, "a1")});
  EXPECT_FALSE(session.all_started());
  session.apply({1, delta(jobs[1].request_id, "a2", finish_reason::stop, 4, 1)});
  session.apply({2, delta(jobs[2].request_id, "b1", finish_reason::length, 6, 1)});
  EXPECT_TRUE(session.all_started());
  EXPECT_EQ(session.unfinished_request_ids(), (std::vector<int64_t>{jobs[0].request_id, jobs[3].request_id}));
  session.apply({0, delta(jobs[0].request_id, "!", finish_reason::length, 4, 2)});
  session.apply({3, delta(jobs[3].request_id, "", finish_reason::stop, 6, 2)});
  ASSERT_TRUE(session.all_finished());
  json body = json::parse(session.full_body());
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "m");
  ASSERT_EQ(body["choices"].size(), 4u);
  EXPECT_EQ(body["choices"][0]["text"], "a1!");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][1]["text"], "a2");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][3]["index"], 3);
  // Each prompt's tokens count once; every sample's output counts.
  EXPECT_EQ(body["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(body["usage"]["completion_tokens"], 6);
  EXPECT_EQ(body["usage"]["total_tokens"], 16);
}

std::vector<json> sse_payloads(const std::string& text, bool& saw_done) {
  std::vector<json> out;
  saw_done = false;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find("\n\n", at);
    EXPECT_NE(end, std::string::npos);
    std::string event = text.substr(at, end - at);
    at = end + 2;
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    if (event == "data: [DONE]") {
      saw_done = true;
    } else {
      out.push_back(json::parse(event.substr(6)));
    }
  }
  return out;
}

TEST(generation_session, streams_chat_chunks_role_first_then_usage_and_done) {
  openai_request r;
  r.endpoint = openai_endpoint::chat_completions;
  r.model = "m";
  openai_prompt chat;
  chat.kind = prompt_kind::rendered_chat;
  chat.text = "user: hi\nassistant:";
  r.prompts = {chat};
  r.stream = true;
  r.include_usage = true;
  generation_session session(r, 2, 1000, token_text);
  session.apply({0, delta(session.request_id(0), "Hel")});
  bool done = false;
  auto first = sse_payloads(session.take_stream_text(), done);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_FALSE(done);
  EXPECT_EQ(first[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(first[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first[0]["choices"][0]["delta"]["content"], "Hel");
  EXPECT_TRUE(first[0]["usage"].is_null());
  session.apply({0, delta(session.request_id(0), "")});  // nothing to say: no chunk
  EXPECT_EQ(session.take_stream_text(), "");
  session.apply({0, delta(session.request_id(0), "lo", finish_reason::stop, 3, 4)});
  auto rest = sse_payloads(session.take_stream_text(), done);
  EXPECT_TRUE(done);
  EXPECT_TRUE(session.stream_ended());
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_FALSE(rest[0]["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(rest[0]["choices"][0]["delta"]["content"], "lo");
  EXPECT_EQ(rest[0]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(rest[1]["choices"].empty());
  EXPECT_EQ(rest[1]["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(rest[1]["usage"]["completion_tokens"], 4);
}

TEST(generation_session, a_failed_choice_fails_the_request_with_its_status) {
  generation_session session(two_prompts_two_samples(openai_endpoint::completions, false), 2, 1000, token_text);
  session.apply({1, request_failed{session.request_id(1), error_code::prompt_too_long, "too long"}});
  ASSERT_TRUE(session.failure());
  EXPECT_EQ(session.failure()->status, 400);
  EXPECT_EQ(session.failure()->code, "context_length_exceeded");
  EXPECT_EQ(session.failure()->param, "prompt");
  EXPECT_EQ(session.unfinished_request_ids().size(), 3u);
  generation_session overloaded(two_prompts_two_samples(openai_endpoint::completions, true), 2, 1000, token_text);
  overloaded.apply({0, request_failed{overloaded.request_id(0), error_code::overloaded, "queue full"}});
  EXPECT_EQ(overloaded.failure()->status, 503);
  bool done = false;
  auto events = sse_payloads(overloaded.take_stream_text(), done);
  EXPECT_TRUE(done);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["error"]["message"], "queue full");
}

TEST(generation_session, completion_logprobs_name_tokens_and_offsets) {
  openai_request r = two_prompts_two_samples(openai_endpoint::completions, false);
  r.prompts.resize(1);
  r.n = 1;
  r.logprobs = 1;
  generation_session session(r, 2, 1000, token_text);
  text_delta d = delta(session.request_id(0), "xy", finish_reason::length, 1, 2);
  d.delta.token_ids = {5, 12};
  d.delta.logprobs = {token_logprobs{-0.5f, {5, 6}, {-0.5f, -1.0f}}, token_logprobs{-0.25f, {12}, {-0.25f}}};
  session.apply({0, d});
  json body = json::parse(session.full_body());
  const auto& lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"t5", "t12"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -0.25}));
  EXPECT_EQ(lp["top_logprobs"][0], json({{"t5", -0.5}}));  // top 1 asked for
  EXPECT_EQ(lp["text_offset"], json({0, 2}));
}

// A special token the text skips (skip_special_tokens) keeps its entry but adds no bytes: the
// offsets after it still point into the text. Kept (skip_special_tokens false), it shows.
TEST(generation_session, a_skipped_special_token_has_no_bytes_in_logprobs) {
  auto special = [](int32_t id) { return id == 9; };
  for (bool skip : {true, false}) {
    openai_request r = two_prompts_two_samples(openai_endpoint::completions, false);
    r.prompts.resize(1);
    r.n = 1;
    r.logprobs = 0;
    r.sampling.skip_special_tokens = skip;
    generation_session session(r, 2, 1000, token_text, std::nullopt, special);
    text_delta d = delta(session.request_id(0), skip ? "t5t12" : "t5t9t12", finish_reason::length, 1, 3);
    d.delta.token_ids = {5, 9, 12};
    d.delta.logprobs = {token_logprobs{-0.5f, {}, {}}, token_logprobs{-0.75f, {}, {}}, token_logprobs{-0.25f, {}, {}}};
    session.apply({0, d});
    const json lp = json::parse(session.full_body())["choices"][0]["logprobs"];
    EXPECT_EQ(lp["tokens"], skip ? json({"t5", "", "t12"}) : json({"t5", "t9", "t12"}));
    EXPECT_EQ(lp["text_offset"], skip ? json({0, 2, 2}) : json({0, 2, 4}));
    EXPECT_EQ(lp["token_logprobs"].size(), 3u);
  }
}

// prompt_logprobs in vLLM's shape: null first, then the prompt's token (with its rank) and the
// top n by id; on each completion choice, once.
TEST(generation_session, prompt_logprobs_in_vllms_shape) {
  openai_request r = two_prompts_two_samples(openai_endpoint::completions, false);
  r.prompts.resize(1);
  r.n = 1;
  r.sampling.prompt_logprobs = 1;
  generation_session session(r, 2, 1000, token_text);
  text_delta first = delta(session.request_id(0), "a");
  first.delta.token_ids = {7};
  first.delta.prompt_logprobs = {prompt_token_logprob{403, -2.5f, 3, {11}, {-0.5f}},
                                 prompt_token_logprob{261, -0.25f, 1, {261}, {-0.25f}}};
  session.apply({0, first});
  text_delta last = delta(session.request_id(0), "b", finish_reason::length, 3, 2);
  last.delta.token_ids = {8};
  session.apply({0, last});
  const json body = json::parse(session.full_body());
  const json expected = json::array({nullptr,
                                     {{"403", {{"logprob", -2.5}, {"rank", 3}, {"decoded_token", "t403"}}},
                                      {"11", {{"logprob", -0.5}, {"rank", 1}, {"decoded_token", "t11"}}}},
                                     {{"261", {{"logprob", -0.25}, {"rank", 1}, {"decoded_token", "t261"}}}}});
  EXPECT_EQ(body["choices"][0]["prompt_logprobs"], expected) << body.dump();
}

TEST(metrics_text, prometheus_exposition) {
  metrics_snapshot m;
  m.num_requests_http = 3;
  m.num_requests_in_flight = 2;
  m.scheduler = metrics_snapshot::scheduler_gauges{10, 20, 1, 2};
  m.num_slo_rejections = 4;
  m.num_overload_refusals = 9;
  std::string text = render_metrics(m);
  EXPECT_NE(text.find("troupe_requests_rejected_total{reason=\"ttft_unattainable\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_requests_rejected_total{reason=\"decode_behind\"} 9\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE troupe_requests_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_requests_total{door=\"http\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_requests_in_flight 2\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_kv_blocks_free 10\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_kv_blocks_total 20\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_sequences_running 1\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_sequences_waiting 2\n"), std::string::npos);
  m.scheduler.reset();
  EXPECT_EQ(render_metrics(m).find("troupe_kv_blocks_free"), std::string::npos);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

openai_request chat_request_of(bool stream) {
  openai_request r;
  r.endpoint = openai_endpoint::chat_completions;
  r.model = "m";
  openai_prompt chat;
  chat.kind = prompt_kind::rendered_chat;
  chat.text = "prompt";
  r.prompts = {chat};
  r.stream = stream;
  return r;
}

output_parsing qwen3_parsing() {
  output_parsing p;
  p.format = {tool_call_syntax::hermes, reasoning_syntax::think};
  p.parse_tool_calls = true;
  return p;
}

text_delta piece(int64_t id, std::string text, finish_reason finish = finish_reason::none) {
  text_delta d;
  d.delta.request_id = id;
  d.delta.token_ids = {1};
  d.text = std::move(text);
  d.delta.finish = finish;
  if (finish != finish_reason::none) {
    request_metrics m;
    m.num_prompt_tokens = 7;
    m.num_output_tokens = 9;
    d.delta.metrics = m;
  }
  return d;
}

const std::vector<std::string> qwen3_output = {"<th", "ink>\nPlan", " it.\n</think>\n\n",
                                               "<tool_call>\n{\"name\": \"get_weather\", ",
                                               "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"};

std::string streamed_text(generation_session& session) {
  std::string all;
  for (size_t i = 0; i < qwen3_output.size(); ++i) {
    const bool last = i + 1 == qwen3_output.size();
    session.apply({0, piece(session.request_id(0), qwen3_output[i], last ? finish_reason::stop : finish_reason::none)});
    all += session.take_stream_text();
  }
  return all;
}

TEST(generation_session, a_chat_answer_splits_into_reasoning_content_and_tool_calls) {
  generation_session whole(chat_request_of(false), 2, 1000, token_text, qwen3_parsing());
  for (size_t i = 0; i < qwen3_output.size(); ++i) {
    const bool last = i + 1 == qwen3_output.size();
    whole.apply({0, piece(whole.request_id(0), qwen3_output[i], last ? finish_reason::stop : finish_reason::none)});
  }
  const json body = json::parse(whole.full_body());
  const json& message = body["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "Plan it.\n");
  EXPECT_TRUE(message["content"].is_null());
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], R"({"city":"Oslo"})");
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(message["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");

  // Streamed: reasoning and the call each in chunks of their own, reassembling to the same.
  generation_session stream(chat_request_of(true), 2, 1000, token_text, qwen3_parsing());
  bool done = false;
  const auto chunks = sse_payloads(streamed_text(stream), done);
  EXPECT_TRUE(done);
  std::string reasoning, content;
  json calls = json::array();
  std::string finish;
  for (const auto& c : chunks) {
    const json& delta = c["choices"][0]["delta"];
    EXPECT_FALSE(delta.contains("reasoning_content") && delta.contains("content")) << c.dump();
    if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"].get<std::string>();
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (delta.contains("tool_calls")) {
      for (const auto& t : delta["tool_calls"]) calls.push_back(t);
    }
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning, "Plan it.\n");
  EXPECT_EQ(content, "");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["arguments"], message["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(calls[0]["id"], message["tool_calls"][0]["id"]);  // the same request id, the same call id
  EXPECT_EQ(finish, "tool_calls");
}

TEST(anthropic_response, a_message_and_its_events_in_anthropic_shape) {
  openai_request r = chat_request_of(false);
  r.endpoint = openai_endpoint::anthropic_messages;
  generation_session whole(
      r, 2, std::make_unique<anthropic_response_builder>("m", "msg_1", tool_call_syntax::hermes, 2), qwen3_parsing());
  for (size_t i = 0; i < qwen3_output.size(); ++i) {
    const bool last = i + 1 == qwen3_output.size();
    whole.apply({0, piece(whole.request_id(0), qwen3_output[i], last ? finish_reason::stop : finish_reason::none)});
  }
  const json message = json::parse(whole.full_body());
  EXPECT_EQ(message["type"], "message");
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["stop_reason"], "tool_use");
  ASSERT_EQ(message["content"].size(), 2u);
  EXPECT_EQ(message["content"][0]["type"], "thinking");
  EXPECT_EQ(message["content"][0]["thinking"], "Plan it.\n");
  EXPECT_EQ(message["content"][1]["type"], "tool_use");
  EXPECT_EQ(message["content"][1]["name"], "get_weather");
  EXPECT_EQ(message["content"][1]["input"], json({{"city", "Oslo"}}));
  EXPECT_EQ(message["content"][1]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(message["usage"]["input_tokens"], 7);
  EXPECT_EQ(message["usage"]["output_tokens"], 9);

  r.stream = true;
  generation_session stream(
      r, 2, std::make_unique<anthropic_response_builder>("m", "msg_1", tool_call_syntax::hermes, 2), qwen3_parsing());
  const std::string text = streamed_text(stream);
  EXPECT_TRUE(stream.stream_ended());
  // event: NAME / data: {...} pairs, in Anthropic's order.
  std::vector<std::string> names;
  std::vector<json> data;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) names.push_back(line.substr(7));
    if (line.rfind("data: ", 0) == 0) data.push_back(json::parse(line.substr(6)));
  }
  ASSERT_EQ(names.size(), data.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(data[i]["type"], names[i]);
  const std::vector<std::string> expected = {"message_start",       "content_block_start", "content_block_delta",
                                             "content_block_delta", "content_block_delta", "content_block_stop",
                                             "content_block_start", "content_block_delta", "content_block_stop",
                                             "message_delta",       "message_stop"};
  EXPECT_EQ(names, expected);
  std::string thinking;
  for (const auto& d : data) {
    if (d["type"] == "content_block_delta" && d["delta"]["type"] == "thinking_delta")
      thinking += d["delta"]["thinking"].get<std::string>();
  }
  EXPECT_EQ(thinking, "Plan it.\n");
  EXPECT_EQ(data[6]["content_block"]["type"], "tool_use");
  EXPECT_EQ(data[6]["index"], 1);
  EXPECT_EQ(json::parse(data[7]["delta"]["partial_json"].get<std::string>()), json({{"city", "Oslo"}}));
  EXPECT_EQ(data[9]["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(data[9]["usage"]["output_tokens"], 9);
  EXPECT_EQ(anthropic_error_json(bad_parameter("max_tokens", "'max_tokens': missing")),
            R"({"error":{"message":"'max_tokens': missing","type":"invalid_request_error"},"type":"error"})");
}

TEST(generation_session, logprob_bytes_add_up_to_the_text_and_offsets_count_characters) {
  openai_request r = two_prompts_two_samples(openai_endpoint::completions, false);
  r.prompts.resize(1);
  r.prompts[0].text = "caf\xc3\xa9 ";  // echo: 5 characters before the tokens
  r.n = 1;
  r.logprobs = 0;
  r.echo = true;
  // Tokens: " \xe2" + "\x82\xac" (a split euro sign), then "s".
  auto bytes_of = [](int32_t id) -> std::string { return id == 1 ? " \xe2" : id == 2 ? "\x82\xac" : "s"; };
  generation_session session(r, 2, 1000, bytes_of);
  text_delta d = delta(session.request_id(0),
                       " \xe2\x82\xac"
                       "s",
                       finish_reason::length, 1, 3);
  d.delta.token_ids = {1, 2, 3};
  d.delta.logprobs = {token_logprobs{-0.5f, {}, {}}, token_logprobs{-0.25f, {}, {}}, token_logprobs{-1.0f, {}, {}}};
  session.apply({0, d});
  const json body = json::parse(session.full_body());
  EXPECT_EQ(body["choices"][0]["text"],
            "caf\xc3\xa9  \xe2\x82\xac"
            "s");
  const auto& lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"][0], "bytes:\\x20\\xe2");
  EXPECT_EQ(lp["tokens"][2], "s");
  EXPECT_EQ(lp["tokens"][1], "bytes:\\x82\\xac");
  // " €s" after "café ": the space is character 5, the euro sign 6 (both its pieces), "s" 7.
  EXPECT_EQ(lp["text_offset"], json({5, 6, 7}));
}

}  // namespace
}  // namespace troupe
