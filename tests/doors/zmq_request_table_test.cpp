// The ZeroMQ door's bookkeeping without a socket: requests in, replies (addressed by routing id)
// and work for the stages out, as the door's thread would see them.

#include <gtest/gtest.h>

#include <algorithm>

#include "doors/zmq_request_table.hpp"

namespace troupe {
namespace {

generate_request generate(const std::string& id, bool stream = true) {
  generate_request r;
  r.id = id;
  r.prompt = "Once upon a time";
  r.stream = stream;
  return r;
}

text_delta piece(int64_t request_id, const std::string& text, std::vector<int32_t> token_ids,
                 finish_reason finish = finish_reason::none) {
  text_delta d;
  d.delta.request_id = request_id;
  d.delta.token_ids = std::move(token_ids);
  d.delta.finish = finish;
  if (finish != finish_reason::none) {
    request_metrics m;
    m.num_prompt_tokens = 5;
    m.num_output_tokens = 3;
    // The scheduler's segments, on its clock: from its own receipt of the request.
    m.queue_time = 0.01;
    m.ttft = 0.25;
    m.tpot = 0.002;
    m.e2e = 99.0;
    d.delta.metrics = m;
  }
  d.text = text;
  return d;
}

text_batch batch_of(std::vector<text_delta> deltas) { return text_batch{std::move(deltas)}; }

const delta_reply& as_delta(const addressed_reply& r) {
  const auto* d = std::get_if<delta_reply>(&r.reply);
  if (!d) throw std::runtime_error("expected a delta reply");
  return *d;
}

const error_reply& as_error(const addressed_reply& r) {
  const auto* e = std::get_if<error_reply>(&r.reply);
  if (!e) throw std::runtime_error("expected an error reply");
  return *e;
}

struct zmq_request_table_test : ::testing::Test {
  request_admission admission{16};
  zmq_request_table table{admission, 100};

  // Submits `request` from `routing_id` and returns the request id the stages got.
  int64_t submit(const std::string& routing_id, generate_request request) {
    auto out = table.on_request(routing_id, std::move(request), 1234);
    EXPECT_TRUE(out.replies.empty());
    EXPECT_TRUE(out.submit.has_value());
    return out.submit ? out.submit->request_id : -1;
  }
};

TEST_F(zmq_request_table_test, a_request_goes_to_the_stages_with_its_prompt_and_sampling) {
  auto request = generate("a");
  request.sampling.max_tokens = 7;
  request.priority = 3;
  auto out = table.on_request("peer-1", request, 1234);
  ASSERT_TRUE(out.submit);
  EXPECT_EQ(out.submit->kind, prompt_kind::text);
  EXPECT_EQ(out.submit->prompt, "Once upon a time");
  EXPECT_EQ(out.submit->sampling.max_tokens, 7);
  EXPECT_EQ(out.submit->priority, 3);
  EXPECT_EQ(request_admission::door_of(out.submit->request_id), client_door::zmq);
  EXPECT_TRUE(out.aborts.empty());
  EXPECT_FALSE(out.stats_query);
  EXPECT_EQ(table.num_live_requests(), 1u);
  EXPECT_EQ(admission.num_in_flight(), 1);

  auto by_ids = generate("b");
  by_ids.prompt.reset();
  by_ids.prompt_token_ids = std::vector<int32_t>{1, 2, 3};
  out = table.on_request("peer-1", by_ids, 1);
  ASSERT_TRUE(out.submit);
  EXPECT_EQ(out.submit->kind, prompt_kind::token_ids);
  EXPECT_EQ(out.submit->prompt_token_ids, (std::vector<int32_t>{1, 2, 3}));
}

TEST_F(zmq_request_table_test, streaming_replies_go_to_the_requests_client_piece_by_piece) {
  const int64_t id = submit("peer-1", generate("a"));
  auto out = table.on_event(batch_of({piece(id, "Once", {10}), piece(id, "", {})}), 1234 + 50'000'000);
  // An empty piece that finishes nothing is not worth a frame.
  ASSERT_EQ(out.replies.size(), 1u);
  EXPECT_EQ(out.replies[0].routing_id, "peer-1");
  EXPECT_EQ(as_delta(out.replies[0]).id, "a");
  EXPECT_EQ(as_delta(out.replies[0]).text, "Once");
  EXPECT_FALSE(as_delta(out.replies[0]).finish_reason);

  out = table.on_event(batch_of({piece(id, " upon", {11, 12}, finish_reason::length)}), 1234 + 200'000'000);
  ASSERT_EQ(out.replies.size(), 1u);
  const auto& last = as_delta(out.replies[0]);
  EXPECT_EQ(last.text, " upon");
  EXPECT_EQ(last.token_ids, (std::vector<int32_t>{11, 12}));
  EXPECT_EQ(last.finish_reason, "length");
  ASSERT_TRUE(last.usage);
  EXPECT_EQ(last.usage->prompt_tokens, 5);
  EXPECT_EQ(last.usage->completion_tokens, 3);
  ASSERT_TRUE(last.timings);
  EXPECT_DOUBLE_EQ(last.timings->ttft, 0.05);  // the door's clock: arrival at 1234 ns -> first tokens
  EXPECT_FALSE(last.logprobs);                 // not asked for
  // Finished: forgotten, its slot returned, and a late event for it sends nothing.
  EXPECT_EQ(table.num_live_requests(), 0u);
  EXPECT_EQ(admission.num_in_flight(), 0);
  EXPECT_TRUE(table.on_event(batch_of({piece(id, "late", {1})})).replies.empty());
}

// Issue 10: the stages may run on other hosts, so the door reports ttft and e2e from its own
// clock (arrival -> first tokens back, arrival -> final back) and only queue and tpot, segments
// the scheduler measured on its one clock, from the stages: never a stamp of one host minus
// another's. The scheduler's own ttft (0.25 s) and e2e (99 s) here must not reach the client.
TEST_F(zmq_request_table_test, ttft_and_e2e_are_the_doors_own_clock_and_queue_is_the_schedulers) {
  const timestamp_ns arrival = 7'000'000'000;
  for (bool stream : {true, false}) {
    auto out = table.on_request("peer-1", generate(stream ? "s" : "whole", stream), arrival);
    ASSERT_TRUE(out.submit);
    const int64_t id = out.submit->request_id;
    (void)table.on_event(batch_of({piece(id, "", {})}), arrival + 10'000'000);  // no tokens yet
    (void)table.on_event(batch_of({piece(id, "Once", {10})}), arrival + 30'000'000);
    out = table.on_event(batch_of({piece(id, " upon", {11}, finish_reason::stop)}), arrival + 80'000'000);
    ASSERT_EQ(out.replies.size(), 1u);
    const auto& last = as_delta(out.replies[0]);
    ASSERT_TRUE(last.timings);
    EXPECT_DOUBLE_EQ(last.timings->queue, 0.01);
    EXPECT_DOUBLE_EQ(last.timings->ttft, 0.03);
    EXPECT_DOUBLE_EQ(last.timings->e2e, 0.08);
    EXPECT_DOUBLE_EQ(last.timings->tpot, 0.002);
    EXPECT_LE(last.timings->queue, last.timings->ttft);
    EXPECT_LE(last.timings->ttft, last.timings->e2e);
  }
  // Ended before any token (aborted while queued): its first reply is its last, ttft == e2e.
  auto out = table.on_request("peer-1", generate("early"), arrival);
  ASSERT_TRUE(out.submit);
  out = table.on_event(batch_of({piece(out.submit->request_id, "", {}, finish_reason::abort)}), arrival + 5'000'000);
  ASSERT_EQ(out.replies.size(), 1u);
  ASSERT_TRUE(as_delta(out.replies[0]).timings);
  EXPECT_DOUBLE_EQ(as_delta(out.replies[0]).timings->ttft, 0.005);
  EXPECT_DOUBLE_EQ(as_delta(out.replies[0]).timings->e2e, 0.005);
}

TEST_F(zmq_request_table_test, a_request_that_does_not_stream_gets_one_reply_with_everything) {
  auto request = generate("whole", /*stream=*/false);
  request.sampling.logprobs = 1;
  const int64_t id = submit("peer-1", request);
  auto first = piece(id, "Once", {10});
  first.delta.logprobs = {token_logprobs{-0.5f, {10}, {-0.5f}}};
  EXPECT_TRUE(table.on_event(batch_of({first})).replies.empty());
  auto second = piece(id, " upon", {11}, finish_reason::stop);
  second.delta.logprobs = {token_logprobs{-1.5f, {12}, {-1.0f}}};
  auto out = table.on_event(batch_of({second}));
  ASSERT_EQ(out.replies.size(), 1u);
  const auto& all = as_delta(out.replies[0]);
  EXPECT_EQ(all.id, "whole");
  EXPECT_EQ(all.text, "Once upon");
  EXPECT_EQ(all.token_ids, (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(all.finish_reason, "stop");
  ASSERT_TRUE(all.logprobs);
  ASSERT_EQ(all.logprobs->size(), 2u);
  EXPECT_EQ((*all.logprobs)[0].token_id, 10);
  EXPECT_FLOAT_EQ((*all.logprobs)[1].logprob, -1.5f);
  ASSERT_EQ((*all.logprobs)[1].top.size(), 1u);
  EXPECT_EQ((*all.logprobs)[1].top[0].first, 12);
  ASSERT_TRUE(all.usage);
  EXPECT_EQ(all.usage->completion_tokens, 3);
  EXPECT_EQ(admission.num_in_flight(), 0);
}

TEST_F(zmq_request_table_test, replies_of_interleaved_requests_reach_their_own_clients) {
  const int64_t a = submit("peer-1", generate("x"));
  const int64_t b = submit("peer-2", generate("x"));  // the same client id, another client
  auto out = table.on_event(batch_of({piece(b, "B", {2}), piece(a, "A", {1})}));
  ASSERT_EQ(out.replies.size(), 2u);
  EXPECT_EQ(out.replies[0].routing_id, "peer-2");
  EXPECT_EQ(as_delta(out.replies[0]).text, "B");
  EXPECT_EQ(out.replies[1].routing_id, "peer-1");
  EXPECT_EQ(as_delta(out.replies[1]).text, "A");
}

TEST_F(zmq_request_table_test, a_client_id_still_in_flight_for_the_same_client_is_refused) {
  const int64_t id = submit("peer-1", generate("dup"));
  auto out = table.on_request("peer-1", generate("dup"), 1);
  EXPECT_FALSE(out.submit);
  ASSERT_EQ(out.replies.size(), 1u);
  EXPECT_EQ(out.replies[0].routing_id, "peer-1");
  EXPECT_EQ(as_error(out.replies[0]).id, "dup");
  EXPECT_EQ(as_error(out.replies[0]).code, error_code::duplicate_id);
  EXPECT_NE(as_error(out.replies[0]).message.find("'dup'"), std::string::npos);
  EXPECT_EQ(admission.num_in_flight(), 1);  // the refusal took no slot
  // Once finished, the id is free again.
  (void)table.on_event(batch_of({piece(id, "", {1}, finish_reason::stop)}));
  EXPECT_TRUE(table.on_request("peer-1", generate("dup"), 1).submit);
}

TEST_F(zmq_request_table_test, abort_names_the_clients_own_request_and_only_that) {
  const int64_t id = submit("peer-1", generate("a"));
  auto out = table.on_request("peer-1", abort_request{"a", ""}, 1);
  EXPECT_TRUE(out.replies.empty());
  EXPECT_EQ(out.aborts, std::vector<int64_t>{id});

  // Another client cannot abort it, and an unknown id is an error naming it.
  out = table.on_request("peer-2", abort_request{"a", ""}, 1);
  EXPECT_TRUE(out.aborts.empty());
  ASSERT_EQ(out.replies.size(), 1u);
  EXPECT_EQ(out.replies[0].routing_id, "peer-2");
  EXPECT_EQ(as_error(out.replies[0]).code, error_code::not_found);
  out = table.on_request("peer-1", abort_request{"nope", ""}, 1);
  ASSERT_EQ(out.replies.size(), 1u);
  EXPECT_EQ(as_error(out.replies[0]).code, error_code::not_found);
  EXPECT_NE(as_error(out.replies[0]).message.find("'nope'"), std::string::npos);

  // The aborted request's final delta still reaches its client, which is still there.
  out = table.on_event(batch_of({piece(id, "", {}, finish_reason::abort)}));
  ASSERT_EQ(out.replies.size(), 1u);
  EXPECT_EQ(as_delta(out.replies[0]).finish_reason, "abort");
  EXPECT_EQ(admission.num_in_flight(), 0);
}

TEST_F(zmq_request_table_test, stats_are_asked_of_the_stages_and_answered_to_the_asker) {
  (void)submit("peer-1", generate("busy"));
  auto out = table.on_request("peer-2", stats_request{"s1", ""}, 1);
  ASSERT_TRUE(out.stats_query);
  EXPECT_EQ(request_admission::door_of_tag(*out.stats_query), client_door::zmq);
  EXPECT_TRUE(out.replies.empty());
  EXPECT_EQ(table.num_stats_waiting(), 1u);

  out = table.on_event(stats_answer{*out.stats_query, 90, 100, 1, 2, {}});
  ASSERT_EQ(out.replies.size(), 1u);
  EXPECT_EQ(out.replies[0].routing_id, "peer-2");
  const auto* stats = std::get_if<stats_reply>(&out.replies[0].reply);
  ASSERT_TRUE(stats);
  EXPECT_EQ(stats->id, "s1");
  EXPECT_EQ(stats->num_free_blocks, 90);
  EXPECT_EQ(stats->num_total_blocks, 100);
  EXPECT_EQ(stats->num_running, 1);
  EXPECT_EQ(stats->num_waiting, 2);
  EXPECT_EQ(stats->num_requests_in_flight, 1);
  EXPECT_EQ(table.num_stats_waiting(), 0u);
  // An answer nobody waits for (answered already, or never asked) sends nothing.
  EXPECT_TRUE(table.on_event(stats_answer{12345, 0, 0, 0, 0, {}}).replies.empty());
}

TEST_F(zmq_request_table_test, a_node_that_cannot_answer_stats_says_why) {
  auto out = table.on_request("peer-1", stats_request{"s1", ""}, 1);
  ASSERT_TRUE(out.stats_query);
  out = table.on_event(
      stats_answer{*out.stats_query, 0, 0, 0, 0, "the node is out of service: the scheduler stage failed"});
  ASSERT_EQ(out.replies.size(), 1u);
  const auto* error = std::get_if<error_reply>(&out.replies[0].reply);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->id, "s1");
  EXPECT_EQ(error->code, error_code::internal);
  EXPECT_NE(error->message.find("out of service"), std::string::npos) << error->message;
  EXPECT_EQ(table.num_stats_waiting(), 0u);
}

TEST_F(zmq_request_table_test, stats_queries_left_waiting_are_bounded) {
  for (size_t i = 0; i < zmq_request_table::max_stats_waiters; ++i) {
    ASSERT_TRUE(table.on_request("peer-1", stats_request{std::to_string(i), ""}, 1).stats_query);
  }
  auto out = table.on_request("peer-1", stats_request{"one too many", ""}, 1);
  EXPECT_FALSE(out.stats_query);
  ASSERT_EQ(out.replies.size(), 1u);
  EXPECT_EQ(as_error(out.replies[0]).id, "one too many");
  EXPECT_EQ(as_error(out.replies[0]).code, error_code::overloaded);
}

TEST_F(zmq_request_table_test, a_gone_client_has_its_requests_aborted_and_gets_no_more_replies) {
  const int64_t a = submit("peer-1", generate("a"));
  const int64_t b = submit("peer-1", generate("b", /*stream=*/false));
  const int64_t other = submit("peer-2", generate("a"));
  auto out = table.on_client_gone("peer-1");
  std::sort(out.aborts.begin(), out.aborts.end());
  EXPECT_EQ(out.aborts, (std::vector<int64_t>{std::min(a, b), std::max(a, b)}));
  EXPECT_TRUE(out.replies.empty());
  // Told twice (another event for the same connection): aborted once.
  EXPECT_TRUE(table.on_client_gone("peer-1").aborts.empty());

  // What still comes back for peer-1 is dropped, the other client's is sent.
  out = table.on_event(batch_of({piece(a, "x", {1}), piece(other, "y", {2}), piece(b, "z", {3})}));
  ASSERT_EQ(out.replies.size(), 1u);
  EXPECT_EQ(out.replies[0].routing_id, "peer-2");
  // Their finals free their slots without a reply.
  out = table.on_event(batch_of({piece(a, "", {}, finish_reason::abort), piece(b, "", {}, finish_reason::abort)}));
  EXPECT_TRUE(out.replies.empty());
  EXPECT_EQ(table.num_live_requests(), 1u);
  EXPECT_EQ(admission.num_in_flight(), 1);
}

TEST_F(zmq_request_table_test, a_closed_connection_aborts_the_requests_of_every_client_on_it) {
  const int64_t a = submit("peer-1", generate("a"));
  const int64_t b = submit("peer-2", generate("b"));
  EXPECT_FALSE(table.knows_peer(7, "peer-1"));
  table.add_peer(7, "peer-1");
  table.add_peer(8, "peer-2");
  EXPECT_TRUE(table.knows_peer(7, "peer-1"));
  EXPECT_FALSE(table.knows_peer(7, "peer-2"));

  EXPECT_TRUE(table.on_disconnected(99).aborts.empty());  // a connection that never sent anything
  auto out = table.on_disconnected(7);
  EXPECT_EQ(out.aborts, std::vector<int64_t>{a});
  EXPECT_FALSE(table.knows_peer(7, "peer-1"));
  EXPECT_EQ(table.num_connections(), 1u);
  // The descriptor reused by a new client: its disconnect is that client's, not peer-1's again.
  const int64_t c = submit("peer-3", generate("c"));
  table.add_peer(7, "peer-3");
  EXPECT_EQ(table.on_disconnected(7).aborts, std::vector<int64_t>{c});
  EXPECT_EQ(table.on_disconnected(8).aborts, std::vector<int64_t>{b});
}

TEST_F(zmq_request_table_test, a_failed_request_is_an_error_reply_and_frees_its_slot) {
  const int64_t id = submit("peer-1", generate("f"));
  auto out = table.on_event(request_failed{id, error_code::prompt_too_long, "field 'prompt': 900 tokens"});
  ASSERT_EQ(out.replies.size(), 1u);
  EXPECT_EQ(out.replies[0].routing_id, "peer-1");
  EXPECT_EQ(as_error(out.replies[0]).id, "f");
  EXPECT_EQ(as_error(out.replies[0]).code, error_code::prompt_too_long);
  EXPECT_EQ(as_error(out.replies[0]).message, "field 'prompt': 900 tokens");
  EXPECT_EQ(admission.num_in_flight(), 0);
  // Twice, or for a request never seen: nothing.
  EXPECT_TRUE(table.on_event(request_failed{id, error_code::internal, "again"}).replies.empty());
  EXPECT_EQ(admission.num_in_flight(), 0);

  // A gone client's failure frees the slot silently.
  const int64_t gone = submit("peer-2", generate("g"));
  (void)table.on_client_gone("peer-2");
  EXPECT_TRUE(table.on_event(request_failed{gone, error_code::internal, "step failed"}).replies.empty());
  EXPECT_EQ(admission.num_in_flight(), 0);
}

TEST(zmq_request_table_limits, requests_beyond_the_shared_bound_are_overloaded_until_one_finishes) {
  request_admission admission(2);
  zmq_request_table table(admission, 100);
  // The other door holds one slot.
  ASSERT_TRUE(admission.admit(client_door::http));
  auto first = table.on_request("peer-1", generate("1"), 1);
  ASSERT_TRUE(first.submit);
  auto out = table.on_request("peer-1", generate("2"), 1);
  EXPECT_FALSE(out.submit);
  ASSERT_EQ(out.replies.size(), 1u);
  EXPECT_EQ(std::get<error_reply>(out.replies[0].reply).code, error_code::overloaded);
  EXPECT_NE(std::get<error_reply>(out.replies[0].reply).message.find("holds 2 requests"), std::string::npos);
  EXPECT_EQ(table.num_live_requests(), 1u);
  EXPECT_EQ(admission.num_refused(client_door::zmq), 1u);
  // The access log's record of it: the client's id, the code, the reason it was told.
  ASSERT_EQ(out.refusals.size(), 1u);
  EXPECT_EQ(out.refusals[0].client_id, "2");
  EXPECT_EQ(out.refusals[0].code, "overloaded");
  EXPECT_EQ(out.refusals[0].message, std::get<error_reply>(out.replies[0].reply).message);
  EXPECT_TRUE(first.refusals.empty()) << "an admitted request is no refusal";

  (void)table.on_event(batch_of({piece(first.submit->request_id, "", {1}, finish_reason::stop)}));
  EXPECT_TRUE(table.on_request("peer-1", generate("2"), 1).submit);
}

TEST(zmq_request_table_limits, a_token_prompt_that_fills_the_context_is_refused_before_admission) {
  request_admission admission(4);
  zmq_request_table table(admission, 4);
  auto request = generate("long");
  request.prompt.reset();
  request.prompt_token_ids = std::vector<int32_t>{1, 2, 3, 4};
  auto out = table.on_request("peer-1", request, 1);
  EXPECT_FALSE(out.submit);
  ASSERT_EQ(out.replies.size(), 1u);
  const auto& error = std::get<error_reply>(out.replies[0].reply);
  EXPECT_EQ(error.code, error_code::prompt_too_long);
  EXPECT_NE(error.message.find("field 'prompt_token_ids': 4 tokens"), std::string::npos);
  EXPECT_EQ(admission.num_in_flight(), 0);
  request.prompt_token_ids->pop_back();
  EXPECT_TRUE(table.on_request("peer-1", request, 1).submit);
}

}  // namespace
}  // namespace troupe
