// The reply router feeds the serving metrics and the trace log for the requests of both doors:
// a request is timed from its tracking (its entry into the stages) to its final delta, and a
// trace answer goes back to the door that asked.

#include <gtest/gtest.h>

#include <variant>
#include <vector>

#include "doors/reply_router.hpp"

namespace troupe {
namespace {

struct recording_inbox : door_inbox {
  std::vector<door_event> events;
  void post(door_event event) override { events.push_back(std::move(event)); }
};

text_batch one_delta(int64_t id, finish_reason finish) {
  text_delta d;
  d.delta.request_id = id;
  d.delta.token_ids = {1};
  d.delta.finish = finish;
  if (finish != finish_reason::none) {
    request_metrics m;
    m.num_prompt_tokens = 3;
    m.num_output_tokens = 2;
    d.delta.metrics = m;
  }
  return text_batch{{d}};
}

TEST(reply_router_metrics, requests_of_both_doors_are_timed_and_logged_failed_ones_not) {
  recording_inbox zmq, http;
  reply_router router;
  router.set_door(client_door::zmq, &zmq);
  router.set_door(client_door::http, &http);
  request_admission admission(8, 1);
  const int64_t from_zmq = *admission.admit(client_door::zmq);
  const int64_t from_http = *admission.admit(client_door::http);
  const int64_t failing = *admission.admit(client_door::http);
  const timestamp_ns before = steady_now_ns();
  for (int64_t id : {from_zmq, from_http, failing}) ASSERT_TRUE(router.track(id));
  for (int64_t id : {from_zmq, from_http}) router.route(one_delta(id, finish_reason::none));
  router.route(request_failed{failing, error_code::internal, "boom"});
  for (int64_t id : {from_zmq, from_http}) router.route(one_delta(id, finish_reason::stop));

  const serving_metrics_snapshot s = router.counters().metrics.snapshot();
  EXPECT_EQ(s.time_to_first_token.count(), 2u);
  EXPECT_EQ(s.e2e_request_latency.count(), 2u);
  EXPECT_EQ(s.inter_token_latency.count(), 2u);
  EXPECT_EQ(s.num_finished_stop, 2u);
  EXPECT_EQ(router.counters().metrics.num_live(), 0u);
  const std::vector<request_record> logged = router.counters().requests.finished_since(before);
  ASSERT_EQ(logged.size(), 2u);
  EXPECT_EQ(logged[0].request_id, from_zmq);
  EXPECT_EQ(logged[1].request_id, from_http);
  EXPECT_GE(logged[0].arrival, before);
  EXPECT_LE(logged[0].arrival, logged[0].first_token);
  EXPECT_LE(logged[0].first_token, logged[0].finish);
}

TEST(reply_router_metrics, a_trace_answer_goes_to_the_door_its_tag_names) {
  recording_inbox zmq, http;
  reply_router router;
  router.set_door(client_door::zmq, &zmq);
  router.set_door(client_door::http, &http);
  request_admission admission(8, 1);
  router.route(trace_answer{admission.next_stats_tag(client_door::http), {}, {}, {}});
  EXPECT_TRUE(zmq.events.empty());
  ASSERT_EQ(http.events.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<trace_answer>(http.events[0]));
}

}  // namespace
}  // namespace troupe
