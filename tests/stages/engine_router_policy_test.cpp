// The router with a route policy (stages/route_policy.hpp) before its own: a choice is honoured
// against the load, no opinion leaves the built-in policy, a failed or invalid answer fails the
// request without routing it, and what the policy sees (candidates, loads, prefix hits, tenant).

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stages/engine_router.hpp"

namespace troupe {
namespace {

constexpr int block_size = 4;

schedule_request request(int64_t id, std::vector<int32_t> prompt, std::string tenant = {}) {
  schedule_request r;
  r.request_id = id;
  r.prompt_ids = std::move(prompt);
  r.sampling.max_tokens = 8;
  r.targets.tenant = std::move(tenant);
  return r;
}

std::vector<int32_t> prompt_of(int first, int length) {
  std::vector<int32_t> ids;
  for (int i = 0; i < length; ++i) ids.push_back(first + i);
  return ids;
}

// Answers what the test sets, and keeps what it was asked.
class fake_policy final : public route_policy {
 public:
  std::string name() const override { return "fake policy"; }
  route_decision choose(const route_query& request, const std::vector<route_candidate>& candidates) override {
    last_request = request;
    last_candidates = candidates;
    ++num_calls;
    return answer;
  }

  route_decision answer;
  route_query last_request;
  std::vector<route_candidate> last_candidates;
  int num_calls = 0;
};

TEST(engine_router_policy, the_chosen_instance_takes_the_request_against_the_load) {
  engine_router router(block_size);
  auto policy = std::make_shared<fake_policy>();
  router.set_route_policy(policy);
  router.add_instance("a");
  const auto b = router.add_instance("b");
  policy->answer = route_decision::choose(1);
  // The built-in policy would alternate; every one goes to b, however much queues there.
  for (int64_t id = 1; id <= 4; ++id) {
    auto where = router.route(request(id, prompt_of(100 * int(id), 30), "acme"));
    ASSERT_TRUE(where) << router.route_error();
    EXPECT_EQ(where->instance, b);
  }
  EXPECT_EQ(policy->num_calls, 4);
  EXPECT_EQ(router.instances()[size_t(b)].num_queued_prompt_tokens, 120);
  // What it saw of the fourth: the tenant, the prompt, both instances with b's queue.
  EXPECT_EQ(policy->last_request.request_id, 4);
  EXPECT_EQ(policy->last_request.tenant, "acme");
  EXPECT_EQ(policy->last_request.num_prompt_ids, 30u);
  ASSERT_EQ(policy->last_candidates.size(), 2u);
  EXPECT_EQ(policy->last_candidates[0].node, "a");
  EXPECT_EQ(policy->last_candidates[1].num_requests, 3);
  EXPECT_EQ(policy->last_candidates[1].num_queued_prompt_tokens, 90);
}

TEST(engine_router_policy, no_opinion_leaves_the_built_in_policy) {
  engine_router router(block_size);
  auto policy = std::make_shared<fake_policy>();
  router.set_route_policy(policy);
  const auto a = router.add_instance("a");
  const auto b = router.add_instance("b");
  const auto first = router.route(request(1, prompt_of(100, 30)));
  ASSERT_TRUE(first);
  // The first one's 30 queued tokens send the next to the other instance, as without a policy.
  const auto second = router.route(request(2, prompt_of(200, 9)));
  ASSERT_TRUE(second);
  EXPECT_EQ(second->instance, first->instance == a ? b : a);
  EXPECT_EQ(policy->num_calls, 2);
}

TEST(engine_router_policy, a_failure_or_a_wrong_index_fails_the_request_unrouted) {
  engine_router router(block_size);
  auto policy = std::make_shared<fake_policy>();
  router.set_route_policy(policy);
  router.add_instance("a");
  router.add_instance("b");
  policy->answer = route_decision::fail("plugin 'x' failed in its route hook: down");
  EXPECT_FALSE(router.route(request(1, {1, 2})));
  EXPECT_EQ(router.route_error(), "plugin 'x' failed in its route hook: down");
  EXPECT_FALSE(router.instance_of(1));
  policy->answer = route_decision::choose(2);
  EXPECT_FALSE(router.route(request(2, {1, 2})));
  EXPECT_EQ(router.route_error(), "fake policy chose candidate 2 of 2");
  // Nothing was charged to any instance, and a good answer routes again (the error cleared).
  for (const engine_instance_info& info : router.instances()) EXPECT_EQ(info.num_requests, 0);
  policy->answer = route_decision::choose(0);
  ASSERT_TRUE(router.route(request(3, {1, 2})));
  EXPECT_EQ(router.route_error(), "");
}

TEST(engine_router_policy, a_draining_instance_is_a_candidate_the_policy_may_not_choose) {
  engine_router router(block_size);
  auto policy = std::make_shared<fake_policy>();
  router.set_route_policy(policy);
  const auto a = router.add_instance("a");
  const auto b = router.add_instance("b");
  ASSERT_TRUE(router.drain(a));
  policy->answer = route_decision::choose(0);
  EXPECT_FALSE(router.route(request(1, {1, 2})));
  EXPECT_EQ(router.route_error(), "fake policy chose engine instance 0, which is draining and takes no new request");
  ASSERT_EQ(policy->last_candidates.size(), 2u) << "the draining one is shown, marked";
  EXPECT_EQ(policy->last_candidates[0].state, engine_state::draining);
  EXPECT_EQ(policy->last_candidates[1].state, engine_state::active);
  policy->answer = route_decision::no_opinion();
  auto where = router.route(request(2, {1, 2}));
  ASSERT_TRUE(where);
  EXPECT_EQ(where->instance, b);
  // With every instance draining the policy is not asked: nothing can take the request.
  ASSERT_TRUE(router.drain(b));
  const int calls = policy->num_calls;
  EXPECT_FALSE(router.route(request(3, {1, 2})));
  EXPECT_EQ(router.route_error(), "");
  EXPECT_EQ(policy->num_calls, calls);
}

TEST(engine_router_policy, the_policy_sees_the_prefix_hit_estimate_and_its_choice_owns_the_prefix) {
  engine_router router(block_size);
  auto policy = std::make_shared<fake_policy>();
  router.set_route_policy(policy);
  router.add_instance("a");
  router.add_instance("b");
  policy->answer = route_decision::choose(1);
  ASSERT_TRUE(router.route(request(1, prompt_of(10, 9))));
  // The same first block again: b holds it; a short prompt has no estimate.
  policy->answer = route_decision::no_opinion();
  ASSERT_TRUE(router.route(request(2, prompt_of(10, 6))));
  ASSERT_EQ(policy->last_candidates.size(), 2u);
  EXPECT_EQ(policy->last_candidates[0].prefix_hit_tokens, 0);
  EXPECT_EQ(policy->last_candidates[1].prefix_hit_tokens, block_size);
  ASSERT_TRUE(router.route(request(3, {10, 11})));
  EXPECT_EQ(policy->last_candidates[1].prefix_hit_tokens, -1);
}

TEST(engine_router_policy, in_a_disaggregated_topology_the_policy_chooses_the_prefill_half) {
  engine_router router(block_size);
  auto policy = std::make_shared<fake_policy>();
  router.set_route_policy(policy);
  router.add_instance("p0", engine_role::prefill);
  const auto p1 = router.add_instance("p1", engine_role::prefill);
  const auto d = router.add_instance("d", engine_role::decode);
  policy->answer = route_decision::choose(1);
  auto where = router.route(request(1, prompt_of(10, 9)));
  ASSERT_TRUE(where);
  EXPECT_EQ(where->instance, p1);
  EXPECT_EQ(where->decode, std::optional<engine_instance_id>(d));
  ASSERT_EQ(policy->last_candidates.size(), 2u) << "the prefill instances only";
  EXPECT_EQ(policy->last_candidates[1].role, engine_role::prefill);
}

}  // namespace
}  // namespace troupe
