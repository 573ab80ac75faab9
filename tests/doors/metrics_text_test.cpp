// The Prometheus text rendering of the troupe: families: histograms cumulative up to +Inf, label
// values escaped, the gauges only when the scheduler answered, and the extension text appended.

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "doors/http/metrics_text.hpp"
#include "doors/latency_histogram.hpp"

namespace troupe {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(latency_histogram, an_observation_on_a_bound_falls_in_that_bounds_bucket) {
  latency_histogram h({0.1, 0.5});
  h.observe(0.1);
  h.observe(0.2);
  h.observe(0.5);
  h.observe(7.0);
  EXPECT_EQ(h.bucket_counts(), (std::vector<uint64_t>{1, 2, 1}));
  EXPECT_EQ(h.count(), 4u);
  EXPECT_DOUBLE_EQ(h.sum(), 7.8);
}

TEST(metrics_text, a_histogram_is_cumulative_and_ends_with_inf_sum_and_count) {
  latency_histogram h({0.001, 0.01, 1});
  for (double s : {0.0005, 0.002, 0.003, 0.5, 30.0}) h.observe(s);
  std::string out;
  render_histogram(out, "troupe:x_seconds", "Help.", "model_name=\"m\"", h);
  EXPECT_EQ(lines_of(out), (std::vector<std::string>{
                               "# HELP troupe:x_seconds Help.",
                               "# TYPE troupe:x_seconds histogram",
                               "troupe:x_seconds_bucket{model_name=\"m\",le=\"0.001\"} 1",
                               "troupe:x_seconds_bucket{model_name=\"m\",le=\"0.01\"} 3",
                               "troupe:x_seconds_bucket{model_name=\"m\",le=\"1\"} 4",
                               "troupe:x_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 5",
                               "troupe:x_seconds_sum{model_name=\"m\"} 30.5055",
                               "troupe:x_seconds_count{model_name=\"m\"} 5",
                           }));
}

TEST(metrics_text, a_histogram_without_labels_has_only_le) {
  latency_histogram h({1});
  std::string out;
  render_histogram(out, "h", "H.", "", h);
  EXPECT_NE(out.find("h_bucket{le=\"1\"} 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("h_bucket{le=\"+Inf\"} 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("h_sum 0\nh_count 0\n"), std::string::npos) << out;
}

TEST(metrics_text, label_values_escape_backslash_quote_and_newline) {
  EXPECT_EQ(escape_label_value("plain-name_1.gguf"), "plain-name_1.gguf");
  EXPECT_EQ(escape_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  metrics_snapshot m;
  m.model_name = "my \"model\"\n";
  const std::string text = render_metrics(m);
  EXPECT_NE(text.find("troupe:prompt_tokens_total{model_name=\"my \\\"model\\\"\\n\"} 0\n"), std::string::npos) << text;
  // No raw line feed inside a sample: every line is a comment or a name followed by a value.
  for (const std::string& line : lines_of(text)) {
    ASSERT_FALSE(line.empty());
    EXPECT_TRUE(line[0] == '#' || line.rfind("troupe", 0) == 0) << line;
  }
}

TEST(metrics_text, serving_families_render_counts_by_reason_and_the_gauges_when_known) {
  metrics_snapshot m;
  m.model_name = "m";
  m.serving.num_prompt_tokens = 12;
  m.serving.num_generation_tokens = 34;
  m.serving.num_preemptions = 2;
  m.serving.num_finished_stop = 3;
  m.serving.num_finished_length = 4;
  m.serving.num_finished_abort = 1;
  m.serving.time_to_first_token.observe(0.003);
  std::string text = render_metrics(m);
  for (const char* line :
       {"troupe:prompt_tokens_total{model_name=\"m\"} 12\n", "troupe:generation_tokens_total{model_name=\"m\"} 34\n",
        "troupe:num_preemptions_total{model_name=\"m\"} 2\n",
        "troupe:request_success_total{model_name=\"m\",finished_reason=\"stop\"} 3\n",
        "troupe:request_success_total{model_name=\"m\",finished_reason=\"length\"} 4\n",
        "troupe:request_success_total{model_name=\"m\",finished_reason=\"abort\"} 1\n",
        "troupe:time_to_first_token_seconds_count{model_name=\"m\"} 1\n",
        "# TYPE troupe:e2e_request_latency_seconds histogram\n", "# TYPE troupe:request_queue_time_seconds histogram\n",
        "# TYPE troupe:inter_token_latency_seconds histogram\n",
        "# TYPE troupe:time_per_output_token_seconds histogram\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
  EXPECT_EQ(text.find("troupe:num_requests_running"), std::string::npos) << "no scheduler answer, no gauge";

  m.scheduler = metrics_snapshot::scheduler_gauges{25, 100, 3, 5};
  m.extra = "# TYPE troupe:stage_mailbox_depth gauge\ntroupe:stage_mailbox_depth{stage=\"tokenizer\"} 4\n";
  text = render_metrics(m);
  EXPECT_NE(text.find("troupe:num_requests_running{model_name=\"m\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe:num_requests_waiting{model_name=\"m\"} 5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe:kv_cache_usage_perc{model_name=\"m\"} 0.75\n"), std::string::npos) << text;
  EXPECT_EQ(text.substr(text.size() - m.extra.size()), m.extra);
}

}  // namespace
}  // namespace troupe
