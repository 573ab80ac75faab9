#include "stages/detokenizer_shards.hpp"

#include <algorithm>
#include <set>

#include <gtest/gtest.h>

namespace troupe {
namespace {

token_batch batch_of(const std::vector<int64_t>& delta_ids, const std::vector<int64_t>& failure_ids) {
  token_batch b;
  for (int64_t id : delta_ids) {
    token_delta d;
    d.request_id = id;
    b.deltas.push_back(d);
    request_timeline t;
    t.tokenize_ns = id * 10;  // marks which delta the timeline belongs to
    b.timelines.push_back(t);
  }
  for (int64_t id : failure_ids) {
    request_failed f;
    f.request_id = id;
    b.failures.push_back(f);
  }
  return b;
}

TEST(detokenizer_shards, every_delta_goes_with_its_timeline_to_its_requests_owner_in_order) {
  const std::vector<int64_t> ids = {4, 7, 9, 2, 5, 12, 31, 6};
  const std::vector<token_batch> parts = split_for_detokenizers(batch_of(ids, {3, 8}), 3);
  ASSERT_EQ(parts.size(), 3u);
  size_t deltas = 0, failures = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    ASSERT_EQ(parts[i].deltas.size(), parts[i].timelines.size());
    size_t last_position = 0;
    for (size_t j = 0; j < parts[i].deltas.size(); ++j) {
      const int64_t id = parts[i].deltas[j].request_id;
      EXPECT_EQ(detokenizer_of(id, 3), i);
      EXPECT_EQ(parts[i].timelines[j].tokenize_ns, id * 10) << "a timeline left its delta";
      const auto position = static_cast<size_t>(std::find(ids.begin(), ids.end(), id) - ids.begin());
      if (j > 0) {
        EXPECT_GT(position, last_position) << "the batch's order is kept within a part";
      }
      last_position = position;
      ++deltas;
    }
    for (const request_failed& f : parts[i].failures) {
      EXPECT_EQ(detokenizer_of(f.request_id, 3), i);
      ++failures;
    }
  }
  EXPECT_EQ(deltas, ids.size());
  EXPECT_EQ(failures, 2u);
}

TEST(detokenizer_shards, one_detokenizer_takes_the_batch_whole_and_none_takes_nothing) {
  const std::vector<token_batch> one = split_for_detokenizers(batch_of({1, 2}, {3}), 1);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].deltas.size(), 2u);
  EXPECT_EQ(one[0].failures.size(), 1u);
  EXPECT_TRUE(split_for_detokenizers(batch_of({1}, {}), 0).empty());
}

// A request id's low bit names its door and bits 62..48 its controller: the requests of one door
// (every other id) must still reach every detokenizer, not half of them.
TEST(detokenizer_shards, the_requests_of_one_door_reach_every_detokenizer) {
  const int64_t controller = int64_t{0x1234} << 48;
  for (size_t n : {2u, 4u}) {
    std::set<size_t> owners;
    for (int64_t sequence = 0; sequence < 64; ++sequence)
      owners.insert(detokenizer_of(controller | (sequence << 1), n));
    EXPECT_EQ(owners.size(), n) << n << " detokenizers";
  }
}

}  // namespace
}  // namespace troupe
