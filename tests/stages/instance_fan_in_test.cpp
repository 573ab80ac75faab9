#include "stages/instance_fan_in.hpp"

#include <gtest/gtest.h>

namespace troupe {
namespace {

stats_answer answer_of(int32_t free_blocks, int32_t total_blocks, int32_t running, int32_t waiting) {
  stats_answer a;
  a.num_free_blocks = free_blocks;
  a.num_total_blocks = total_blocks;
  a.num_running = running;
  a.num_waiting = waiting;
  a.num_waiting_for_kv = 1;
  a.num_kv_leases = 2;
  return a;
}

TEST(stats_fan_in, sums_every_answer_and_settles_on_the_last) {
  stats_fan_in total(7, 3);
  total.add(answer_of(10, 64, 1, 2));
  EXPECT_FALSE(total.settled());
  total.fail("instance 2 timed out");
  EXPECT_FALSE(total.settled());
  total.add(answer_of(5, 32, 3, 0));
  ASSERT_TRUE(total.settled());
  const stats_answer sum = total.reply();
  EXPECT_EQ(sum.tag, 7u);
  EXPECT_EQ(sum.num_free_blocks, 15);
  EXPECT_EQ(sum.num_total_blocks, 96);
  EXPECT_EQ(sum.num_running, 4);
  EXPECT_EQ(sum.num_waiting, 2);
  EXPECT_EQ(sum.num_waiting_for_kv, 2);
  EXPECT_EQ(sum.num_kv_leases, 4);
  EXPECT_EQ(sum.unavailable, "") << "some instance answered: the counts stand";
}

TEST(stats_fan_in, each_process_is_reported_once_however_many_instances_it_holds) {
  // Two instances in one node process and one in another: two processes, the first answer's.
  stats_fan_in total(8, 3);
  stats_answer a = answer_of(1, 16, 0, 0), b = answer_of(1, 16, 0, 0), c = answer_of(1, 16, 0, 0);
  a.processes = {{"host:11", 5.0, 4.0}};
  b.processes = {{"host:11", 5.5, 4.5}};
  c.processes = {{"host:12", 2.0, 1.0}};
  total.add(a);
  total.add(b);
  total.add(c);
  const stats_answer sum = total.reply();
  ASSERT_EQ(sum.processes.size(), 2u);
  EXPECT_EQ(sum.processes[0].process, "host:11");
  EXPECT_EQ(sum.processes[0].total_s, 5.0);
  EXPECT_EQ(sum.processes[1].process, "host:12");
}

TEST(stats_fan_in, no_answer_at_all_says_why) {
  stats_fan_in total(1, 2);
  total.fail("first");
  total.fail("request timed out");
  ASSERT_TRUE(total.settled());
  EXPECT_EQ(total.reply().unavailable, "no engine instance answered: request timed out");
}

step_event step_aged(uint64_t id, duration_ns age) {
  step_event s;
  s.step_id = id;
  s.age_ns = age;
  return s;
}

// An instance's ages are measured before its own answer; the router places that answer at the
// midpoint of its round trip and answers with ages before its own reply.
TEST(trace_fan_in, moves_each_instances_ages_onto_the_routers_clock) {
  trace_fan_in total(9, 2);
  trace_answer a;
  a.steps = {step_aged(1, 300), step_aged(2, 100)};
  total.add(4, "node-a", a, /*sent=*/1000, /*received=*/1200);  // answered at 1100
  EXPECT_FALSE(total.settled());
  trace_answer b;
  b.steps = {step_aged(5, 50)};
  total.add(6, "node-b", b, /*sent=*/1010, /*received=*/1410);  // answered at 1210
  ASSERT_TRUE(total.settled());
  const trace_answer all = total.reply(/*now=*/1500);
  EXPECT_EQ(all.tag, 9u);
  EXPECT_EQ(all.unavailable, "");
  ASSERT_EQ(all.instances.size(), 2u);
  EXPECT_EQ(all.instances[0].instance, 4);
  EXPECT_EQ(all.instances[0].node, "node-a");
  EXPECT_EQ(all.instances[1].node, "node-b");
  // Each instance's placement is off by at most half its round trip.
  EXPECT_EQ(all.instances[0].clock_error_ns, 100);
  EXPECT_EQ(all.instances[1].clock_error_ns, 200);
  ASSERT_EQ(all.steps.size(), 3u);
  EXPECT_EQ(all.steps[0].instance, 4);
  EXPECT_EQ(all.steps[0].age_ns, 1500 - (1100 - 300));
  EXPECT_EQ(all.steps[1].age_ns, 1500 - (1100 - 100));
  EXPECT_EQ(all.steps[2].instance, 6);
  EXPECT_EQ(all.steps[2].step_id, 5u);
  EXPECT_EQ(all.steps[2].age_ns, 1500 - (1210 - 50));
}

TEST(trace_fan_in, an_instance_that_fails_is_left_out_and_none_answering_says_why) {
  trace_fan_in some(1, 2);
  trace_answer a;
  a.steps = {step_aged(1, 10)};
  some.fail("gone");
  some.add(0, "n", a, 0, 20);
  const trace_answer partial = some.reply(100);
  EXPECT_EQ(partial.unavailable, "");
  EXPECT_EQ(partial.steps.size(), 1u);

  trace_fan_in none(2, 1);
  none.fail("request timed out");
  ASSERT_TRUE(none.settled());
  EXPECT_EQ(none.reply(5).unavailable, "no engine instance answered: request timed out");
}

}  // namespace
}  // namespace troupe
