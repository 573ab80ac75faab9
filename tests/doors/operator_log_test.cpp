// The operator's log lines (doors/operator_log.hpp, access_log.hpp, throughput_log.hpp): their
// text and JSON renderings, the JSON formatter every line goes through with --log-format json,
// the reply router's one access line per finished or failed request, and a drain's refusal at
// the ZeroMQ door's table.

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "doors/access_log.hpp"
#include "doors/operator_log.hpp"
#include "doors/reply_router.hpp"
#include "doors/throughput_log.hpp"
#include "doors/zmq_request_table.hpp"

namespace troupe {
namespace {

using json = nlohmann::json;

// The default logger writes into `out` for the test's length, in `format`; put back after.
struct captured_log {
  std::ostringstream out;
  std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
  explicit captured_log(log_format format) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("troupe", sink));
    set_log_format(format);
  }
  ~captured_log() {
    set_log_format(log_format::text);
    spdlog::set_default_logger(saved);
  }
  std::vector<std::string> lines() const {
    std::vector<std::string> all;
    std::istringstream in(out.str());
    for (std::string line; std::getline(in, line);) all.push_back(line);
    return all;
  }
};

TEST(access_log, text_and_fields_say_the_same_and_leave_out_what_is_not_known) {
  access_entry e;
  e.request_id = 42;
  e.door = client_door::http;
  e.num_prompt_tokens = 12;
  e.num_output_tokens = 100;
  e.ttft_ms = 15.24;
  e.total_ms = 410;
  e.finish = "stop";
  e.instance = 0;
  EXPECT_EQ(access_log_text(e),
            "request 42 door=http prompt=12 output=100 ttft=15.2ms total=410.0ms finish=stop instance=0");
  const json f = access_log_fields(e);
  EXPECT_EQ(f["request_id"], 42);
  EXPECT_EQ(f["door"], "http");
  EXPECT_EQ(f["prompt_tokens"], 12);
  EXPECT_EQ(f["output_tokens"], 100);
  EXPECT_DOUBLE_EQ(f["ttft_ms"].get<double>(), 15.24);
  EXPECT_EQ(f["finish"], "stop");
  EXPECT_EQ(f["instance"], 0);
  EXPECT_FALSE(f.contains("error"));

  access_entry failed;
  failed.request_id = 7;
  failed.finish = "error";
  failed.error = "unavailable: the server is draining";
  EXPECT_EQ(access_log_text(failed),
            "request 7 door=zmq prompt=0 output=0 finish=error error=\"unavailable: the server is draining\"");
  const json g = access_log_fields(failed);
  EXPECT_FALSE(g.contains("ttft_ms"));
  EXPECT_FALSE(g.contains("instance"));
  EXPECT_EQ(g["error"], "unavailable: the server is draining");
}

TEST(throughput_log, a_line_per_busy_interval_none_for_an_idle_one) {
  throughput_log log;
  throughput_sample s;
  s.at = 1'000'000'000;
  s.has_engine_gauges = true;
  s.num_total_blocks = 200;
  s.num_free_blocks = 200;
  EXPECT_FALSE(log.next(s));  // the first sample only starts the first interval

  s.at += 2'000'000'000;  // 2 s: 100 prompt and 500 generated tokens, 3 finished, 1 running
  s.num_prompt_tokens = 100;
  s.num_generation_tokens = 500;
  s.num_finished = 3;
  s.num_running = 1;
  s.num_free_blocks = 150;
  auto line = log.next(s);
  ASSERT_TRUE(line);
  EXPECT_DOUBLE_EQ(line->seconds, 2.0);
  EXPECT_DOUBLE_EQ(line->prompt_tokens_per_s, 50.0);
  EXPECT_DOUBLE_EQ(line->generation_tokens_per_s, 250.0);
  EXPECT_EQ(line->num_finished, 3u);
  EXPECT_DOUBLE_EQ(line->kv_used_percent, 25.0);
  EXPECT_EQ(throughput_log_text(*line),
            "throughput: prompt 50.0 tok/s, generation 250.0 tok/s, 3 finished over 2.0 s; running 1, waiting 0; "
            "KV cache 25.0% used");
  const json f = throughput_log_fields(*line);
  EXPECT_DOUBLE_EQ(f["generation_tokens_per_s"].get<double>(), 250.0);
  EXPECT_EQ(f["running"], 1);

  s.at += 2'000'000'000;  // still running, no token: a line (the engine is busy)
  EXPECT_TRUE(log.next(s));
  s.at += 2'000'000'000;  // idle: nothing ran, finished or waited
  s.num_running = 0;
  EXPECT_FALSE(log.next(s));
  s.at += 2'000'000'000;  // no gauges (no engine answered) but tokens passed: a line without them
  s.has_engine_gauges = false;
  s.num_generation_tokens += 10;
  line = log.next(s);
  ASSERT_TRUE(line);
  EXPECT_EQ(throughput_log_text(*line).find("running"), std::string::npos);
  EXPECT_FALSE(throughput_log_fields(*line).contains("kv_used_percent"));
}

TEST(access_log, a_refusal_names_the_door_code_and_why_and_quotes_what_the_client_sent) {
  refusal_entry http{client_door::http, {}, "invalid_request_error", 401, "incorrect API key provided",
                     "/v1/completions"};
  EXPECT_EQ(refusal_log_text(http),
            "refused door=http status=401 path=\"/v1/completions\" code=invalid_request_error "
            "error=\"incorrect API key provided\"");
  const json f = refusal_log_fields(http);
  EXPECT_EQ(f["door"], "http");
  EXPECT_EQ(f["finish"], "refused");
  EXPECT_EQ(f["http_status"], 401);
  EXPECT_EQ(f["path"], "/v1/completions");
  EXPECT_FALSE(f.contains("client_id"));

  // A client's id with a newline and a quote cannot forge a line or a field; a long one is cut.
  refusal_entry zmq{client_door::zmq, "a\"b\nrequest 9 finish=stop", "duplicate_id", 0, "still in flight", {}};
  const std::string text = refusal_log_text(zmq);
  EXPECT_EQ(text, "refused door=zmq code=duplicate_id id=\"a\\\"b\\nrequest 9 finish=stop\" error=\"still in flight\"");
  EXPECT_EQ(text.find('\n'), std::string::npos);
  EXPECT_FALSE(refusal_log_fields(zmq).contains("http_status"));
  zmq.client_id = std::string(1000, 'x');
  EXPECT_LT(refusal_log_text(zmq).size(), 300u);
  EXPECT_EQ(refusal_log_fields(zmq)["client_id"].get<std::string>().size(), 128u + 3u);
}

TEST(operator_log, json_format_makes_every_line_one_object_and_structured_fields_top_level) {
  captured_log log(log_format::json);
  spdlog::info("serving: ZeroMQ on {}", "tcp://127.0.0.1:5557");
  spdlog::warn("a quote \" and bad UTF-8 \xff here");
  spdlog::info("{}", "{\"not\": \"structured\"}");
  emit_structured("access", "request 1 ...", json{{"request_id", 1}, {"finish", "stop"}});
  const auto lines = log.lines();
  ASSERT_EQ(lines.size(), 4u) << log.out.str();
  std::vector<json> parsed;
  for (const std::string& line : lines) parsed.push_back(json::parse(line));  // throws on a bad line
  EXPECT_EQ(parsed[0]["msg"], "serving: ZeroMQ on tcp://127.0.0.1:5557");
  EXPECT_EQ(parsed[0]["level"], "info");
  EXPECT_EQ(parsed[0]["time"].get<std::string>().back(), 'Z');
  EXPECT_FALSE(parsed[0].contains("event"));
  EXPECT_EQ(parsed[1]["level"], "warning");
  EXPECT_EQ(parsed[2]["msg"], "{\"not\": \"structured\"}");  // a message is never taken for fields
  EXPECT_EQ(parsed[3]["event"], "access");
  EXPECT_EQ(parsed[3]["request_id"], 1);
  EXPECT_EQ(parsed[3]["finish"], "stop");
  EXPECT_EQ(parsed[3]["msg"], "request 1 ...");
  EXPECT_THROW(parse_log_format("yaml"), std::invalid_argument);
}

TEST(operator_log, text_format_prints_structured_lines_as_their_text) {
  captured_log log(log_format::text);
  emit_structured("throughput", "throughput: prompt 1.0 tok/s", json{{"prompt_tokens_per_s", 1.0}});
  const auto lines = log.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("[throughput] [info] throughput: prompt 1.0 tok/s"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[0].find('{'), std::string::npos) << lines[0];
}

TEST(operator_log, the_reply_router_logs_one_access_line_per_finished_or_failed_request) {
  captured_log log(log_format::json);
  reply_router router;
  router.set_access_log(true);
  const int64_t http_id = 3, zmq_id = 4;  // the low bit is the door
  ASSERT_TRUE(router.track(http_id));
  ASSERT_TRUE(router.track(zmq_id));
  text_delta first;
  first.delta.request_id = http_id;
  first.delta.token_ids = {5, 6};
  router.route(text_batch{{first}});
  text_delta last;
  last.delta.request_id = http_id;
  last.delta.token_ids = {7};
  last.delta.finish = finish_reason::length;
  last.delta.metrics = request_metrics{};
  last.delta.metrics->num_prompt_tokens = 9;
  last.delta.metrics->num_output_tokens = 3;
  last.timeline.instance = 2;
  router.route(text_batch{{last}});
  router.route(request_failed{zmq_id, error_code::unavailable, "drained"});
  EXPECT_EQ(router.counters().num_output_tokens_routed, 3u);

  const auto lines = log.lines();
  ASSERT_EQ(lines.size(), 2u) << log.out.str();  // one per request, none for a delta on the way
  const json done = json::parse(lines[0]);
  EXPECT_EQ(done["event"], "access");
  EXPECT_EQ(done["request_id"], http_id);
  EXPECT_EQ(done["door"], "http");
  EXPECT_EQ(done["prompt_tokens"], 9);
  EXPECT_EQ(done["output_tokens"], 3);
  EXPECT_EQ(done["finish"], "length");
  EXPECT_EQ(done["instance"], 2);
  EXPECT_GE(done["ttft_ms"].get<double>(), 0.0);
  EXPECT_GE(done["total_ms"].get<double>(), done["ttft_ms"].get<double>());
  const json failed = json::parse(lines[1]);
  EXPECT_EQ(failed["door"], "zmq");
  EXPECT_EQ(failed["finish"], "error");
  EXPECT_EQ(failed["error"], "unavailable: drained");

  // Off: no line.
  reply_router quiet;
  ASSERT_TRUE(quiet.track(http_id));
  quiet.route(text_batch{{last}});
  EXPECT_EQ(log.lines().size(), 2u);
}

TEST(operator_log, the_operator_stats_answer_goes_to_its_listener_not_a_door) {
  reply_router router;
  int num_heard = 0;
  router.set_operator_stats_listener([&](const stats_answer& a) { num_heard += a.num_running; });
  router.route(stats_answer{reply_router::operator_stats_tag, 0, 0, 5, 0, ""});
  EXPECT_EQ(num_heard, 5);
}

TEST(request_admission, a_closed_admission_is_refused_at_the_zmq_table_with_unavailable) {
  request_admission admission(16);
  zmq_request_table table(admission, 100);
  EXPECT_FALSE(admission.closed_reason());
  admission.close("the server is draining");
  admission.close("a later reason is not kept");
  ASSERT_TRUE(admission.closed_reason());
  EXPECT_EQ(*admission.closed_reason(), "the server is draining");
  generate_request r;
  r.id = "late";
  r.prompt = "hello";
  auto out = table.on_request("peer", client_request{r}, 1);
  EXPECT_FALSE(out.submit);
  ASSERT_EQ(out.replies.size(), 1u);
  const auto& error = std::get<error_reply>(out.replies[0].reply);
  EXPECT_EQ(error.id, "late");
  EXPECT_EQ(error.code, error_code::unavailable);
  EXPECT_EQ(error.message, "the server is draining");
  EXPECT_EQ(admission.num_in_flight(), 0);
  // Stats still answer while draining (a client may ask how far along it is).
  EXPECT_TRUE(table.on_request("peer", client_request{stats_request{"s", ""}}, 1).stats_query);
}

}  // namespace
}  // namespace troupe
