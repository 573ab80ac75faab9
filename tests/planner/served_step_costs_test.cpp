// What `troupe plan --metrics-url` reads: each role's step-time model from the /metrics text a
// server renders (doors/http/metrics_text), so a disaggregated server's prefill and decode fits
// plan their own instances.

#include "planner/served_step_costs.hpp"

#include <gtest/gtest.h>

#include "doors/http/metrics_text.hpp"

namespace troupe {
namespace {

step_model_report report(int32_t instance, std::string role, std::vector<double> coefficients, double floor) {
  step_model_report r;
  r.instance = instance;
  r.role = std::move(role);
  r.coefficients = std::move(coefficients);
  r.token_floor = floor;
  r.min_step_s = 1e-3 * floor;
  r.num_steps = 100;
  return r;
}

metrics_snapshot served_with(std::vector<step_model_report> models) {
  metrics_snapshot m;
  m.scheduler = metrics_snapshot::scheduler_gauges{10, 682, 0, 0};
  m.step_models = std::move(models);
  return m;
}

TEST(served_step_costs, each_role_gets_its_first_instance_fit_from_the_rendered_metrics) {
  const std::string text = render_metrics(served_with({
      report(0, "prefill", {1e-3, 3e-4, 1e-4, 2e-7, 8e-8}, 1), report(1, "decode", {3e-3, 2e-4, 5e-5, 2e-6, 0}, 16),
      report(2, "decode", {9, 9, 9, 9, 9}, 2),  // a second decode instance: the first one counts
  }));
  const served_step_costs served = parse_served_step_costs(text);
  EXPECT_EQ(served.num_kv_blocks, 682);
  EXPECT_FALSE(served.mixed);
  ASSERT_TRUE(served.prefill);
  ASSERT_TRUE(served.decode);
  EXPECT_EQ(served.prefill->seconds, (step_cost::coefficients{1e-3, 3e-4, 1e-4, 2e-7, 8e-8}));
  EXPECT_EQ(served.prefill->token_floor, 1);
  EXPECT_EQ(served.decode->seconds, (step_cost::coefficients{3e-3, 2e-4, 5e-5, 2e-6, 0}));
  EXPECT_EQ(served.decode->token_floor, 16);
  EXPECT_DOUBLE_EQ(served.decode->min_seconds, 16e-3);
}

TEST(served_step_costs, the_serving_stacks_cpu_is_read_per_message_through_it) {
  // 30 requests finished (by three reasons) that streamed 270 tokens: 300 messages through the
  // stack, which spent 4.5 s of CPU beside 10 s of the model's.
  metrics_snapshot m = served_with({report(0, "mixed", {2e-3, 1e-4, 0, 0, 0}, 1)});
  m.num_finished_stop = 10;
  m.num_finished_length = 15;
  m.num_finished_abort = 5;
  m.num_generation_tokens = 270;
  m.process_cpu_seconds = 14.5;
  m.compute_cpu_seconds = 10;
  const served_step_costs served = parse_served_step_costs(render_metrics(m));
  EXPECT_DOUBLE_EQ(served.stack_cpu_seconds, 4.5);
  EXPECT_EQ(served.num_requests_finished, 30);
  EXPECT_EQ(served.num_generation_tokens, 270);
  EXPECT_DOUBLE_EQ(served.stack_seconds_per_message(), 0.015);
  EXPECT_EQ(served.num_stack_processes, 1);
  // A disaggregated cluster's node processes are shown each once beside this one's, and summed;
  // an instance in this very process is not shown twice.
  m.own_process = "controller:1";
  m.processes = {{"controller:1", 14.5, 10}, {"prefill:2", 3.0, 2.0}, {"decode:3", 4.0, 2.5}};
  const std::string text = render_metrics(m);
  EXPECT_NE(text.find("troupe_node_stack_cpu_seconds_total{process=\"prefill:2\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe_node_compute_cpu_seconds_total{process=\"decode:3\"} 2.5\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("process=\"controller:1\""), std::string::npos) << text;
  const served_step_costs cluster = parse_served_step_costs(text);
  EXPECT_DOUBLE_EQ(cluster.stack_cpu_seconds, 4.5 + 1.0 + 1.5);
  EXPECT_EQ(cluster.num_stack_processes, 3);
  // Before any request finished there is nothing to divide by.
  EXPECT_EQ(parse_served_step_costs(render_metrics(served_with({}))).stack_seconds_per_message(), 0);
}

TEST(served_step_costs, a_colocated_server_gives_the_mixed_fit_and_an_unlabelled_one_counts_as_mixed) {
  const served_step_costs colocated =
      parse_served_step_costs(render_metrics(served_with({report(0, "mixed", {2e-3, 1e-4, 0, 0, 0}, 8)})));
  ASSERT_TRUE(colocated.mixed);
  EXPECT_EQ(colocated.mixed->token_floor, 8);
  EXPECT_FALSE(colocated.prefill);
  const served_step_costs unlabelled = parse_served_step_costs(
      "troupe_step_time_coefficient_seconds{instance=\"0\",feature=\"step\"} 0.002\n"
      "troupe_step_time_coefficient_seconds{instance=\"0\",feature=\"token\"} 0.0001\n"
      "troupe_step_time_coefficient_seconds{instance=\"0\",feature=\"sequence\"} 0\n"
      "troupe_step_time_coefficient_seconds{instance=\"0\",feature=\"context_token\"} 0\n"
      "troupe_step_time_coefficient_seconds{instance=\"0\",feature=\"attention_pair\"} 0\n");
  ASSERT_TRUE(unlabelled.mixed);
  EXPECT_EQ(unlabelled.mixed->seconds[1], 1e-4);
  EXPECT_EQ(unlabelled.mixed->token_floor, 1);
}

TEST(served_step_costs, an_incomplete_fit_is_none_and_a_broken_number_is_named) {
  // The old four-coefficient exposition: no context_token, so no fit.
  const served_step_costs old = parse_served_step_costs(
      "troupe_step_time_coefficient_seconds{instance=\"0\",feature=\"step\"} 0.002\n"
      "troupe_step_time_coefficient_seconds{instance=\"0\",feature=\"token\"} 0.0001\n"
      "troupe_step_time_coefficient_seconds{instance=\"0\",feature=\"sequence\"} 0\n"
      "troupe_step_time_coefficient_seconds{instance=\"0\",feature=\"attention_pair\"} 0\n");
  EXPECT_TRUE(old.empty());
  EXPECT_TRUE(parse_served_step_costs("").empty());
  try {
    parse_served_step_costs("troupe_step_time_token_floor{instance=\"0\",role=\"mixed\"} many\n");
    FAIL() << "a floor that is not a number was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("troupe_step_time_token_floor"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe
