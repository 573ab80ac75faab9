// A stage that fails must not leave its requests hanging: the node ends every request in flight
// with an `internal` error naming the stage, and refuses new requests instead of accepting work
// it can never finish. Driven through node::fail_stage (a failure drill that makes the stage's
// handler throw, as a bug would) on a real node serving the stories model over ZeroMQ.

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <variant>

#include "node/node.hpp"
#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

// One request at a time, so most of the requests sent wait in the scheduler's queue: they are
// certainly in flight when the drill lands, however fast the model is.
topology one_at_a_time() {
  topology t;
  t.model.path = stories_dir;
  t.model.max_num_seqs = 1;
  t.zmq_endpoint = "tcp://127.0.0.1:*";  // the door picks a free port; node::zmq_endpoint() names it
  t.tokenizer_pool_size = 1;
  return t;
}

generate_request long_request(const std::string& id) {
  generate_request r = greedy("Once upon a time", 400);
  r.id = id;
  r.sampling.ignore_eos = true;
  return r;
}

struct outcome {
  int num_deltas = 0;
  bool finished = false;
  std::optional<error_reply> error;
};

// Receives until every id has finished or failed, for at most `within`.
std::map<std::string, outcome> receive_all(client& c, const std::vector<std::string>& ids,
                                           std::chrono::seconds within) {
  std::map<std::string, outcome> outcomes;
  size_t num_done = 0;
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (num_done < ids.size() && std::chrono::steady_clock::now() < deadline) {
    auto reply = c.receive(std::chrono::milliseconds(200));
    if (!reply) continue;
    if (auto* d = std::get_if<delta_reply>(&*reply)) {
      outcome& o = outcomes[d->id];
      ++o.num_deltas;
      if (d->finish_reason) {
        o.finished = true;
        ++num_done;
      }
    } else if (auto* e = std::get_if<error_reply>(&*reply)) {
      outcomes[e->id].error = *e;
      ++num_done;
    }
  }
  return outcomes;
}

// Sends four long requests, waits until the first streams, fails `stage`, and checks that every
// request ends (none hangs), that the waiting ones end with an error naming the stage, and that a
// request sent afterwards is refused at once.
void expect_failure_reaches_every_request(const std::string& stage, const std::string& expected_words) {
  const topology t = one_at_a_time();
  node n(t);  // stops its stages when the test ends, also when an assertion fails
  client c(n.zmq_endpoint());
  c.set_timeout(std::chrono::seconds(5));
  const std::vector<std::string> ids = {"a", "b", "c", "d"};
  for (const auto& id : ids) c.send(long_request(id));

  // The first request is running once its first delta arrives; b, c and d wait behind it.
  std::map<std::string, outcome> early;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (early["a"].num_deltas == 0 && std::chrono::steady_clock::now() < deadline) {
    auto reply = c.receive(std::chrono::milliseconds(200));
    if (!reply) continue;
    auto* d = std::get_if<delta_reply>(&*reply);
    ASSERT_NE(d, nullptr) << "an error before the drill";
    ++early[d->id].num_deltas;
    ASSERT_FALSE(d->finish_reason) << d->id << " finished before the drill";
  }
  ASSERT_GT(early["a"].num_deltas, 0) << "the first request never streamed";

  n.fail_stage(stage, "drill");
  auto outcomes = receive_all(c, ids, std::chrono::seconds(20));
  int num_failed = 0;
  for (const auto& id : ids) {
    SCOPED_TRACE(id);
    const outcome& o = outcomes[id];
    ASSERT_TRUE(o.finished || o.error) << "request " << id << " hangs after the " << stage << " failed";
    if (o.error) {
      ++num_failed;
      EXPECT_EQ(o.error->code, error_code::internal);
      EXPECT_NE(o.error->message.find(expected_words), std::string::npos) << o.error->message;
    }
  }
  // b, c and d cannot have run 400 tokens each before the drill: they waited behind a.
  EXPECT_GE(num_failed, 3);

  // New work is refused with the reason, not accepted to hang. The node turns to refusing when
  // its watch of the stage sees the exit, which may come after the in-flight requests already
  // got their errors another way (a dead worker fails its step): wait for it, bounded.
  for (int i = 0; i < 500 && !n.out_of_service(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(n.out_of_service()) << "the node did not notice the " << stage << " stage's failure within 5 s";
  c.send(long_request("e"));
  auto refused = receive_all(c, {"e"}, std::chrono::seconds(10));
  ASSERT_TRUE(refused["e"].error) << "a request sent after the failure got no error";
  EXPECT_EQ(refused["e"].error->code, error_code::internal);
  EXPECT_NE(refused["e"].error->message.find("out of service"), std::string::npos) << refused["e"].error->message;
  EXPECT_NE(refused["e"].error->message.find("the " + stage + " stage failed"), std::string::npos)
      << refused["e"].error->message;

  // A stats request is answered with the reason too, not left to time out.
  try {
    c.stats();
    ADD_FAILURE() << "stats answered as if the node served";
  } catch (const client_error& e) {
    EXPECT_NE(std::string(e.what()).find("out of service"), std::string::npos) << e.what();
  }
}

TEST(stage_failure_e2e, a_failed_scheduler_ends_every_request_with_an_error) {
  expect_failure_reaches_every_request("scheduler", "the scheduler stage failed");
}

TEST(stage_failure_e2e, a_failed_detokenizer_ends_every_request_with_an_error) {
  expect_failure_reaches_every_request("detokenizer", "the detokenizer stage failed");
}

// The worker's failure reaches the requests of the steps it was sent ("worker unreachable") or
// the node's monitor first; either way each ends with an internal error, and the process lives.
TEST(stage_failure_e2e, a_failed_worker_ends_every_request_with_an_error) {
  expect_failure_reaches_every_request("worker", "worker");
}

TEST(stage_failure_e2e, an_unknown_stage_name_is_refused) {
  const topology t = one_at_a_time();
  node n(t);
  EXPECT_THROW(n.fail_stage("frontend", "drill"), std::invalid_argument);
  EXPECT_THROW(n.fail_stage("schedular", "drill"), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::test
