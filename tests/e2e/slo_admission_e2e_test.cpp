// Early rejection through the real binary: `troupe serve --scheduling-policy slo --slo-admission
// reject` refuses at once (HTTP 429) a request whose TTFT target cannot be met, serves the others,
// and counts the refusal and its step-time model in /metrics.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

using nlohmann::json;

TEST(slo_admission, an_unattainable_ttft_is_refused_at_once_and_counted) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  serve_process server(
      {"--http-port", "0", "--served-model-name", "m", "--scheduling-policy", "slo", "--slo-admission", "reject"});
  httplib::Client c("127.0.0.1", server.http_port());
  c.set_read_timeout(60, 0);
  auto post = [&](const json& extra) {
    json body = {{"model", "m"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
    body.update(extra);
    return c.Post("/v1/completions", body.dump(), "application/json");
  };
  // A generous target is met, and its steps feed the model.
  auto served = post({{"slo", {{"ttft_ms", 60000}, {"tpot_ms", 60000}}}, {"tenant", "a"}});
  ASSERT_TRUE(served);
  EXPECT_EQ(served->status, 200) << served->body;
  // No step is that fast (a nanosecond): refused, at once. Not 10 µs: a stories260K decode step
  // can take less, and a request with that target was once admitted and served (CI).
  const auto start = std::chrono::steady_clock::now();
  auto refused = post({{"slo", {{"ttft_ms", 1e-6}}}});
  const double refused_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 429) << refused->body;
  const json error = json::parse(refused->body)["error"];
  EXPECT_EQ(error["code"], "slo_unattainable") << refused->body;
  EXPECT_NE(error["message"].get<std::string>().find("TTFT target"), std::string::npos) << refused->body;
  EXPECT_LT(refused_ms, 1000) << "refused, but not at once";
  // A negative target is the client's mistake, named.
  auto bad = post({{"slo", {{"ttft_ms", -3}}}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "slo.ttft_ms") << bad->body;

  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  const std::string& text = metrics->body;
  EXPECT_NE(text.find("troupe_requests_rejected_total{reason=\"ttft_unattainable\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe_step_time_coefficient_seconds{instance=\"0\",role=\"mixed\",feature=\"token\"}"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("troupe_step_time_fit_rms_seconds{instance=\"0\"}"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe_step_time_coefficient_seconds{instance=\"0\",role=\"mixed\",feature=\"context_token\"}"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("troupe_step_time_token_floor{instance=\"0\",role=\"mixed\"}"), std::string::npos) << text;
  EXPECT_EQ(text.find("troupe_step_time_steps_observed_total{instance=\"0\"} 0\n"), std::string::npos)
      << "no step measured: " << text;
  // The CPU it spent serving, split: the served request's steps are compute, its door, tokenizer
  // and detokenizer the stack's (what `troupe plan --cores` charges).
  auto value_of = [&](const std::string& family) {
    const size_t at = text.find("\n" + family + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + family.size() + 2));
  };
  EXPECT_GT(value_of("troupe_compute_cpu_seconds_total"), 0) << text;
  EXPECT_GT(value_of("troupe_stack_cpu_seconds_total"), 0) << text;
  EXPECT_GE(value_of("troupe_process_cpu_seconds_total"), value_of("troupe_compute_cpu_seconds_total")) << text;
}

}  // namespace
}  // namespace troupe::test
