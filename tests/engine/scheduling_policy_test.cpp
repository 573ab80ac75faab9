// The scheduling policies on the plain scheduler: admission order, starvation freedom,
// preemption order, prefill chunk sizing and early rejection.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "engine/fair_policy.hpp"
#include "engine/scheduler.hpp"
#include "tests/engine/engine_test_support.hpp"

namespace troupe {
namespace {

using testing::fake_run;
using testing::greedy;
using testing::make_prompt;

std::unique_ptr<scheduler> make(std::string_view policy, int num_blocks, int block_size, int max_num_batched_tokens,
                                int max_num_seqs, std::string_view slo_admission = "best_effort") {
  engine_config config;
  config.num_kv_blocks = num_blocks;
  config.block_size = block_size;
  config.max_num_batched_tokens = max_num_batched_tokens;
  config.max_num_seqs = max_num_seqs;
  config.max_model_len = 4096;
  config.enable_prefix_caching = false;
  config.scheduling_policy = parse_scheduling_policy(policy);
  config.slo_admission = parse_slo_admission(slo_admission);
  return std::make_unique<scheduler>(config, std::vector<int32_t>{testing::test_eos});
}

service_targets targets(std::string tenant, double ttft_ms = 0, double tpot_ms = 0) {
  return service_targets{std::move(tenant), ttft_ms, tpot_ms};
}

engine_clock::time_point ago(double seconds) {
  return engine_clock::now() -
         std::chrono::duration_cast<engine_clock::duration>(std::chrono::duration<double>(seconds));
}

// Steps to the end; returns request ids in the order they were first planned.
std::vector<int64_t> admission_order(scheduler& s, int max_steps = 100000) {
  std::vector<int64_t> order;
  for (int step = 0; step < max_steps && s.has_unfinished(); ++step) {
    step_plan plan = s.schedule();
    for (const auto& entry : plan.sequences) {
      if (std::find(order.begin(), order.end(), entry.request_id) == order.end()) order.push_back(entry.request_id);
    }
    s.update(plan, fake_run(plan));
  }
  EXPECT_FALSE(s.has_unfinished());
  return order;
}

TEST(scheduling_policy, names_parse_both_ways_and_an_unknown_one_is_refused_by_name) {
  for (auto kind : {scheduling_policy_kind::fcfs, scheduling_policy_kind::priority, scheduling_policy_kind::slo,
                    scheduling_policy_kind::fair}) {
    EXPECT_EQ(parse_scheduling_policy(scheduling_policy_name(kind)), kind);
  }
  for (auto mode : {slo_admission_mode::best_effort, slo_admission_mode::reject}) {
    EXPECT_EQ(parse_slo_admission(slo_admission_name(mode)), mode);
  }
  try {
    parse_scheduling_policy("lottery");
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "scheduling policy \"lottery\" is not one of fcfs, priority, slo, fair");
  }
  EXPECT_THROW(parse_slo_admission("maybe"), std::invalid_argument);
}

TEST(scheduling_policy, fcfs_admits_in_arrival_order_whatever_the_priority) {
  auto fcfs = make("fcfs", 64, 16, 256, 1);
  auto prio = make("priority", 64, 16, 256, 1);
  for (auto* s : {fcfs.get(), prio.get()}) {
    ASSERT_FALSE(s->add_request(1, make_prompt(8), greedy(2), /*priority=*/5));
    ASSERT_FALSE(s->add_request(2, make_prompt(8), greedy(2), /*priority=*/0));
    ASSERT_FALSE(s->add_request(3, make_prompt(8), greedy(2), /*priority=*/1));
  }
  EXPECT_EQ(admission_order(*fcfs), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(admission_order(*prio), (std::vector<int64_t>{2, 3, 1}));
}

// Two sequences that outgrow a pool of 4 blocks of 4 tokens: one must be preempted.
std::vector<int64_t> first_preempted(const std::string& policy) {
  auto s = make(policy, 4, 4, 64, 8);
  EXPECT_FALSE(s->add_request(1, make_prompt(4), greedy(10), /*priority=*/5));
  EXPECT_FALSE(s->add_request(2, make_prompt(4), greedy(10), /*priority=*/0));
  for (int step = 0; step < 20; ++step) {
    step_plan plan = s->schedule();
    if (!plan.preempted_ids.empty()) return plan.preempted_ids;
    s->update(plan, fake_run(plan));
  }
  return {};
}

TEST(scheduling_policy, preemption_order_follows_the_policy) {
  EXPECT_EQ(first_preempted("fcfs"), (std::vector<int64_t>{2}));      // the newest
  EXPECT_EQ(first_preempted("priority"), (std::vector<int64_t>{1}));  // the lowest priority
}

TEST(scheduling_policy, a_higher_priority_arrival_preempts_a_lower_priority_sequence) {
  for (const std::string policy : {"priority", "fcfs"}) {
    auto s = make(policy, 64, 16, 256, /*max_num_seqs=*/1);
    ASSERT_FALSE(s->add_request(1, make_prompt(8), greedy(50), /*priority=*/5));
    step_plan plan = s->schedule();
    s->update(plan, fake_run(plan));
    ASSERT_FALSE(s->add_request(2, make_prompt(8), greedy(2), /*priority=*/0));
    plan = s->schedule();
    if (policy == "priority") {
      EXPECT_EQ(plan.preempted_ids, (std::vector<int64_t>{1}));
      ASSERT_EQ(plan.sequences.size(), 1u);
      EXPECT_EQ(plan.sequences[0].request_id, 2);
    } else {
      EXPECT_TRUE(plan.preempted_ids.empty());
      ASSERT_EQ(plan.sequences.size(), 1u);
      EXPECT_EQ(plan.sequences[0].request_id, 1);
    }
    s->update(plan, fake_run(plan));
    admission_order(*s);  // both finish
  }
  // Equal priorities never displace each other.
  auto s = make("priority", 64, 16, 256, 1);
  ASSERT_FALSE(s->add_request(1, make_prompt(8), greedy(50), 3));
  step_plan plan = s->schedule();
  s->update(plan, fake_run(plan));
  ASSERT_FALSE(s->add_request(2, make_prompt(8), greedy(2), 3));
  EXPECT_TRUE(s->schedule().preempted_ids.empty());
}

TEST(scheduling_policy, slo_serves_a_short_prompt_before_an_equally_old_long_one) {
  auto slo = make("slo", 256, 16, 256, 1);
  auto fcfs = make("fcfs", 256, 16, 256, 1);
  for (auto* s : {slo.get(), fcfs.get()}) {
    const auto arrival = ago(1.0);
    ASSERT_FALSE(s->add_request(1, make_prompt(1500), greedy(2), 0, arrival));
    ASSERT_FALSE(s->add_request(2, make_prompt(10), greedy(2), 0, arrival));
  }
  EXPECT_EQ(admission_order(*slo), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(admission_order(*fcfs), (std::vector<int64_t>{1, 2}));
}

TEST(scheduling_policy, slo_does_not_starve_a_long_prompt_that_has_waited) {
  // A long prompt waiting 30 s has a higher response ratio than short ones just come.
  auto s = make("slo", 512, 16, 256, 1);
  ASSERT_FALSE(s->add_request(1, make_prompt(1500), greedy(2), 0, ago(30.0)));
  for (int i = 2; i < 10; ++i) ASSERT_FALSE(s->add_request(i, make_prompt(10), greedy(2)));
  EXPECT_EQ(admission_order(*s).front(), 1);
}

TEST(scheduling_policy, slo_serves_a_request_about_to_miss_its_ttft_first) {
  // The prior predicts a full 256-token step at about 16 ms and a 64-token prefill at about 5 ms:
  // a 15 ms target leaves under one step of slack, so the request is due.
  for (bool with_target : {true, false}) {
    auto s = make("slo", 256, 16, 256, 1);
    ASSERT_FALSE(s->add_request(1, make_prompt(10), greedy(2), 0, ago(1.0)));
    ASSERT_FALSE(s->add_request(2, make_prompt(64), greedy(2), 0, engine_clock::now(), {}, {},
                                targets("", with_target ? 15.0 : 0.0)));
    EXPECT_EQ(admission_order(*s).front(), with_target ? 2 : 1);
  }
}

TEST(scheduling_policy, slo_caps_prefill_so_decodes_keep_their_tpot) {
  for (double tpot_ms : {0.0, 10.0}) {
    auto s = make("slo", 512, 16, 2048, 8);
    for (int i = 1; i <= 4; ++i) {
      ASSERT_FALSE(s->add_request(i, make_prompt(8, 10 * i), greedy(100), 0, engine_clock::now(), {}, {},
                                  targets("", 0, tpot_ms)));
    }
    step_plan plan = s->schedule();
    s->update(plan, fake_run(plan));
    ASSERT_FALSE(s->add_request(9, make_prompt(3000), greedy(2)));
    plan = s->schedule();
    int prefill = 0;
    for (const auto& e : plan.sequences) {
      if (e.request_id == 9) prefill = e.num_new_tokens();
    }
    if (tpot_ms == 0) {
      EXPECT_EQ(prefill, 2048 - 4);  // no target: the whole budget
    } else {
      EXPECT_GE(prefill, 16);
      EXPECT_LT(prefill, 2048 - 4);
      EXPECT_LE(s->step_times().predict(shape_of(outline_of(plan))), tpot_ms / 1000.0);
      step_shape one_more = shape_of(outline_of(plan));
      one_more.add(1, 0);
      EXPECT_GT(s->step_times().predict(one_more), tpot_ms / 1000.0) << "the cap is not the largest that fits";
    }
    s->update(plan, fake_run(plan));
    admission_order(*s);
  }
}

TEST(scheduling_policy, fair_lets_a_light_tenant_pass_a_heavy_backlog) {
  auto fair = make("fair", 256, 16, 256, 1);
  auto fcfs = make("fcfs", 256, 16, 256, 1);
  for (auto* s : {fair.get(), fcfs.get()}) {
    for (int i = 1; i <= 10; ++i) {
      ASSERT_FALSE(s->add_request(i, make_prompt(20), greedy(5), 0, engine_clock::now(), {}, {}, targets("heavy")));
    }
    ASSERT_FALSE(s->add_request(100, make_prompt(20), greedy(5), 0, engine_clock::now(), {}, {}, targets("light")));
  }
  const auto fair_order = admission_order(*fair);
  EXPECT_EQ(fair_order[1], 100) << "the light tenant's request comes right after the first heavy one";
  EXPECT_EQ(admission_order(*fcfs).back(), 100);
}

TEST(scheduling_policy, fair_alternates_tenants_with_backlogs_and_starves_none) {
  auto s = make("fair", 256, 16, 256, 1);
  for (int i = 0; i < 6; ++i) {
    ASSERT_FALSE(s->add_request(i, make_prompt(20), greedy(5), 0, engine_clock::now(), {}, {}, targets("a")));
    ASSERT_FALSE(s->add_request(100 + i, make_prompt(20), greedy(5), 0, engine_clock::now(), {}, {}, targets("b")));
  }
  const auto order = admission_order(*s);
  ASSERT_EQ(order.size(), 12u);
  for (size_t k = 0; k + 1 < order.size(); k += 2) {
    EXPECT_NE(order[k] >= 100, order[k + 1] >= 100) << "positions " << k << " and " << k + 1;
  }
}

TEST(scheduling_policy, fair_gives_an_idle_tenant_no_credit_to_burst_with) {
  fair_policy policy;
  sequence a1(1, make_prompt(4), greedy(2), 0, 0, engine_clock::now(), {}, {}, targets("a"));
  policy.arrived(a1);
  policy.charge(a1, 1000);
  sequence b1(2, make_prompt(4), greedy(2), 0, 1, engine_clock::now(), {}, {}, targets("b"));
  policy.arrived(b1);
  // b comes in at a's count, not at zero: it cannot run 1000 tokens ahead of a.
  EXPECT_EQ(policy.virtual_tokens("b"), 1000);
  policy.left(a1);
  policy.left(b1);
  EXPECT_EQ(policy.virtual_tokens("a"), 0);  // forgotten: bounded memory
}

TEST(scheduling_policy, slo_refuses_at_once_a_request_whose_ttft_cannot_be_met) {
  for (const std::string admission : {"reject", "best_effort"}) {
    auto s = make("slo", 4096, 16, 256, 4, admission);
    // 20 prompts of 2000 tokens: about 160 full steps of prefill queued, over two seconds at the prior.
    for (int i = 1; i <= 20; ++i) ASSERT_FALSE(s->add_request(i, make_prompt(2000, i), greedy(2)));
    auto refused = s->add_request(100, make_prompt(10), greedy(2), 0, engine_clock::now(), {}, {}, targets("", 200));
    auto generous = s->add_request(101, make_prompt(10), greedy(2), 0, engine_clock::now(), {}, {}, targets("", 60000));
    auto untargeted = s->add_request(102, make_prompt(10), greedy(2));
    EXPECT_FALSE(generous);
    EXPECT_FALSE(untargeted);
    if (admission == "reject") {
      ASSERT_TRUE(refused);
      EXPECT_EQ(refused->code, error_code::slo_unattainable);
      EXPECT_NE(refused->message.find("TTFT target of 200 ms cannot be met"), std::string::npos) << refused->message;
      EXPECT_EQ(s->find(100), nullptr);
      EXPECT_EQ(s->num_slo_rejections(), 1);
    } else {
      EXPECT_FALSE(refused);
      EXPECT_EQ(s->num_slo_rejections(), 0);
    }
  }
  // An empty queue meets the target.
  auto s = make("slo", 4096, 16, 256, 4, "reject");
  EXPECT_FALSE(s->add_request(1, make_prompt(10), greedy(2), 0, engine_clock::now(), {}, {}, targets("", 200)));
}

}  // namespace
}  // namespace troupe
