// The router's side of its detokenizers without actors: each request's deltas go to the one
// detokenizer that owns it, and a replaced detokenizer gets, in order, what its clients lack and
// nothing twice, whatever arrives while the frontend is asked (the message orders the detokenizer
// kill tests exercise end to end).

#include <gtest/gtest.h>

#include <vector>

#include "stages/detokenizer_fanout.hpp"
#include "stages/detokenizer_shards.hpp"

namespace troupe {
namespace {

// The first request id, from `from` on, that detokenizer `index` of `num` owns.
int64_t owned_by(size_t index, size_t num, int64_t from = 1) {
  for (int64_t id = from;; ++id) {
    if (detokenizer_of(id, num) == index) return id;
  }
}

token_batch batch_of(std::vector<std::pair<int64_t, std::vector<int32_t>>> deltas) {
  token_batch batch;
  for (auto& [id, tokens] : deltas) {
    token_delta d;
    d.request_id = id;
    d.token_ids = std::move(tokens);
    batch.deltas.push_back(std::move(d));
    batch.timelines.push_back(request_timeline{});
  }
  return batch;
}

std::vector<int64_t> ids_of(const token_batch& batch) {
  std::vector<int64_t> ids;
  for (const token_delta& d : batch.deltas) ids.push_back(d.request_id);
  return ids;
}

TEST(detokenizer_fanout, each_part_goes_to_the_detokenizer_that_owns_its_requests) {
  detokenizer_fanout fanout(2, true);
  const int64_t a = owned_by(0, 2), b = owned_by(1, 2), c = owned_by(1, 2, b + 1);
  const std::vector<detokenizer_fanout::part> parts = fanout.route(batch_of({{a, {5}}, {b, {6}}, {c, {7}}}), 0);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].detokenizer, 0u);
  EXPECT_EQ(ids_of(parts[0].batch), std::vector<int64_t>{a});
  EXPECT_EQ(parts[1].detokenizer, 1u);
  EXPECT_EQ(ids_of(parts[1].batch), (std::vector<int64_t>{b, c}));
  EXPECT_TRUE(fanout.route(token_batch{}, 0).empty()) << "an empty batch sends nothing";
}

TEST(detokenizer_fanout, a_replaced_detokenizer_gets_what_its_clients_lack_then_the_rest_in_order) {
  detokenizer_fanout fanout(2, true);
  const int64_t a = owned_by(0, 2), b = owned_by(1, 2);
  fanout.route(batch_of({{a, {5}}, {b, {6, 7}}}), 0);  // b's client got 6 and 7 from the lost one
  fanout.route(batch_of({{b, {8}}}), 0);               // died in the lost one's mailbox

  const detokenizer_fanout::resume_ticket ticket = fanout.begin_resume(1);
  EXPECT_EQ(ticket.asked, std::vector<int64_t>{b});
  EXPECT_TRUE(fanout.resuming(1));
  // While the frontend is asked, b's next tokens wait; a's detokenizer is not held up.
  const std::vector<detokenizer_fanout::part> during = fanout.route(batch_of({{a, {9}}, {b, {10}}}), 0);
  ASSERT_EQ(during.size(), 1u);
  EXPECT_EQ(during[0].detokenizer, 0u);

  const std::optional<detokenizer_ledger::resumption> out = fanout.finish_resume(ticket, {{b, 2}});
  ASSERT_TRUE(out);
  ASSERT_EQ(out->primes.size(), 1u);
  EXPECT_EQ(out->primes[0].request_id, b);
  EXPECT_EQ(out->primes[0].spelled_ids, (std::vector<int32_t>{6, 7})) << "spelled silently: the client has them";
  std::vector<int32_t> replayed;
  for (const token_delta& d : out->replay.deltas)
    replayed.insert(replayed.end(), d.token_ids.begin(), d.token_ids.end());
  EXPECT_EQ(replayed, (std::vector<int32_t>{8, 10})) << "the lost mailbox's and the held, once each, in order";

  EXPECT_FALSE(fanout.resuming(1));
  const std::vector<detokenizer_fanout::part> after = fanout.route(batch_of({{b, {11}}}), 0);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].detokenizer, 1u) << "once resumed, its parts go straight to it again";
}

TEST(detokenizer_fanout, a_second_replacement_before_the_answer_supersedes_the_first) {
  detokenizer_fanout fanout(1, true);
  fanout.route(batch_of({{4, {1, 2}}}), 0);
  const detokenizer_fanout::resume_ticket first = fanout.begin_resume(0);
  const detokenizer_fanout::resume_ticket second = fanout.begin_resume(0);
  EXPECT_FALSE(fanout.finish_resume(first, {{4, 2}})) << "the first replacement is gone: nothing for it";
  EXPECT_TRUE(fanout.resuming(0)) << "the second still waits for its answer";
  EXPECT_TRUE(fanout.route(batch_of({{4, {3}}}), 0).empty());
  const std::optional<detokenizer_ledger::resumption> out = fanout.finish_resume(second, {{4, 1}});
  ASSERT_TRUE(out);
  ASSERT_EQ(out->primes.size(), 1u);
  EXPECT_EQ(out->primes[0].spelled_ids, std::vector<int32_t>{1});
  std::vector<int32_t> replayed;
  for (const token_delta& d : out->replay.deltas)
    replayed.insert(replayed.end(), d.token_ids.begin(), d.token_ids.end());
  EXPECT_EQ(replayed, (std::vector<int32_t>{2, 3}));
}

TEST(detokenizer_fanout, a_request_that_arrives_during_the_resumption_is_sent_whole) {
  detokenizer_fanout fanout(1, true);
  const detokenizer_fanout::resume_ticket ticket = fanout.begin_resume(0);
  EXPECT_TRUE(ticket.asked.empty());
  EXPECT_TRUE(fanout.route(batch_of({{12, {1, 2}}}), 0).empty()) << "held for the resumption";
  const std::optional<detokenizer_ledger::resumption> out = fanout.finish_resume(ticket, {});
  ASSERT_TRUE(out);
  ASSERT_EQ(out->replay.deltas.size(), 1u) << "its client has nothing: every token goes";
  EXPECT_EQ(out->replay.deltas[0].request_id, 12);
  EXPECT_EQ(out->replay.deltas[0].token_ids, (std::vector<int32_t>{1, 2}));
}

TEST(detokenizer_fanout, without_a_ledger_a_replacement_gets_the_parts_at_once) {
  detokenizer_fanout fanout(1, false);
  fanout.route(batch_of({{3, {1}}}), 0);
  const detokenizer_fanout::resume_ticket ticket = fanout.begin_resume(0);
  EXPECT_TRUE(ticket.asked.empty());
  EXPECT_FALSE(fanout.resuming(0)) << "nothing could be sent it later, so nothing is held back";
  EXPECT_EQ(fanout.route(batch_of({{3, {2}}}), 0).size(), 1u);
  EXPECT_FALSE(fanout.finish_resume(ticket, {}));
}

}  // namespace
}  // namespace troupe
