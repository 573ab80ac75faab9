// The reply router's record of the requests inside the stages: what a node fails when a stage
// dies, and how it refuses new requests afterwards.

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

text_batch finished(int64_t id) {
  text_delta d;
  d.delta.request_id = id;
  d.delta.finish = finish_reason::stop;
  return text_batch{{d}};
}

TEST(reply_router, fail_all_ends_only_the_requests_still_inside_and_closes) {
  recording_inbox zmq, http;
  reply_router router;
  router.set_door(client_door::zmq, &zmq);
  router.set_door(client_door::http, &http);
  const int64_t zmq_a = 2, zmq_b = 4, http_c = 7, zmq_d = 8;  // the low bit is the door
  for (int64_t id : {zmq_a, zmq_b, http_c, zmq_d}) ASSERT_TRUE(router.track(id));
  router.route(finished(zmq_a));                                      // finished: not failed again
  router.route(request_failed{zmq_d, error_code::bad_request, "x"});  // already failed
  EXPECT_EQ(router.num_tracked(), 2u);
  zmq.events.clear();

  EXPECT_EQ(router.fail_all(error_code::internal, "the scheduler stage failed: boom"), 2u);
  ASSERT_EQ(zmq.events.size(), 1u);
  ASSERT_EQ(http.events.size(), 1u);
  const auto& to_zmq = std::get<request_failed>(zmq.events[0]);
  EXPECT_EQ(to_zmq.request_id, zmq_b);
  EXPECT_EQ(to_zmq.code, error_code::internal);
  EXPECT_EQ(to_zmq.message, "the scheduler stage failed: boom");
  EXPECT_EQ(std::get<request_failed>(http.events[0]).request_id, http_c);
  EXPECT_EQ(router.num_tracked(), 0u);

  // Closed: a new request must be refused by its caller, and a second fail_all finds nothing.
  EXPECT_FALSE(router.track(10));
  EXPECT_EQ(router.fail_all(error_code::internal, "again"), 0u);
}

TEST(reply_router, serve_again_takes_requests_after_a_lost_stage_is_back) {
  recording_inbox zmq;
  reply_router router;
  router.set_door(client_door::zmq, &zmq);
  ASSERT_TRUE(router.track(2));
  router.fail_all(error_code::internal, "the tokenizer stage on node t failed");
  EXPECT_TRUE(router.refusing());
  EXPECT_FALSE(router.track(4));
  router.serve_again();
  EXPECT_FALSE(router.refusing());
  EXPECT_TRUE(router.track(4));
  EXPECT_EQ(router.num_tracked(), 1u) << "the failed request stays ended";
}

}  // namespace
}  // namespace troupe
