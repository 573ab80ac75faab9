// The Chrome trace of a window: every finished request on a thread of its own with its phases
// laid end to end, each scheduler instance a process with its steps, and every event in the
// trace-event format (X with ts/dur in microseconds from the window's start, M naming them).

#include <gtest/gtest.h>

#include <algorithm>

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "doors/chrome_trace.hpp"

namespace troupe {
namespace {

using json = nlohmann::json;
constexpr timestamp_ns us = 1000;
constexpr timestamp_ns ms = 1000 * us;

request_record record(int64_t id, timestamp_ns arrival) {
  request_record r;
  r.request_id = id;
  r.arrival = arrival;
  r.timeline.tokenize_ns = 1 * ms;
  r.timeline.queue_ns = 2 * ms;
  r.timeline.num_steps = 3;
  r.first_token = arrival + 5 * ms;
  r.finish = arrival + 9 * ms;
  r.finish_reason_value = finish_reason::length;
  r.num_prompt_tokens = 4;
  r.num_output_tokens = 3;
  return r;
}

placed_step step(int32_t instance, uint64_t id, timestamp_ns start, std::vector<int64_t> requests) {
  step_event e;
  e.instance = instance;
  e.step_id = id;
  e.elapsed_ns = 1 * ms;
  e.num_prefill_sequences = 1;
  e.num_prefill_tokens = 4;
  e.request_ids = std::move(requests);
  return placed_step{start, e};
}

const json* find_event(const json& events, const std::string& name, int pid, int tid) {
  for (const json& e : events) {
    if (e["name"] == name && e["pid"] == pid && e["tid"] == tid) return &e;
  }
  return nullptr;
}

TEST(chrome_trace, lays_out_requests_and_steps_in_the_trace_event_format) {
  trace_window w;
  w.begin = 1000 * ms;
  w.end = 1100 * ms;
  // A request id beyond 2^53 must survive a JavaScript reader: ids travel as strings.
  const int64_t big_id = (int64_t(1) << 60) + 3;
  w.requests = {record(big_id, 1010 * ms), record(7, 1020 * ms)};
  w.steps = {step(0, 41, 1013 * ms, {big_id}), step(2, 42, 1023 * ms, {7, 99})};
  w.instances = {{0, "controller", 0}, {2, "node-b", 1500}};
  const json trace = json::parse(build_chrome_trace(w));
  const json& events = trace.at("traceEvents");
  ASSERT_TRUE(events.is_array());

  for (const json& e : events) {
    SCOPED_TRACE(e.dump());
    ASSERT_TRUE(e.at("name").is_string());
    ASSERT_TRUE(e.at("pid").is_number_integer());
    ASSERT_TRUE(e.at("tid").is_number_integer());
    const std::string ph = e.at("ph");
    ASSERT_TRUE(ph == "X" || ph == "M");
    if (ph == "X") {
      EXPECT_GE(e.at("ts").get<double>(), 0.0);
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
    } else {
      EXPECT_TRUE(e.at("args").at("name").is_string());
    }
  }

  // Processes and threads are named.
  std::map<std::pair<int, int>, std::string> names;
  for (const json& e : events) {
    if (e["ph"] == "M") names[std::make_pair(e["pid"].get<int>(), e["tid"].get<int>())] = e["args"]["name"];
  }
  auto name_of = [&](int pid, int tid) { return names[std::make_pair(pid, tid)]; };
  EXPECT_EQ(name_of(1, 0), "requests");
  EXPECT_EQ(name_of(1, 1), "request " + std::to_string(big_id));
  EXPECT_EQ(name_of(1, 2), "request 7");
  EXPECT_EQ(name_of(100, 0), "scheduler instance 0 on controller");
  EXPECT_EQ(name_of(102, 0), "scheduler instance 2 on node-b");
  // Each instance's row states how far its steps may lie off the requests' clock.
  std::map<int, double> clock_error_us;
  for (const json& e : events) {
    if (e["name"] == "process_name" && e["args"].contains("clock_error_us"))
      clock_error_us[e["pid"]] = e["args"]["clock_error_us"];
  }
  EXPECT_EQ(clock_error_us, (std::map<int, double>{{100, 0.0}, {102, 1.5}}));

  // The first request: its span and its phases, end to end, in microseconds from the window.
  const json* request = find_event(events, "request", 1, 1);
  ASSERT_NE(request, nullptr);
  EXPECT_DOUBLE_EQ((*request)["ts"].get<double>(), 10'000.0);
  EXPECT_DOUBLE_EQ((*request)["dur"].get<double>(), 9'000.0);
  EXPECT_EQ((*request)["args"]["request_id"], std::to_string(big_id));
  EXPECT_EQ((*request)["args"]["finish_reason"], "length");
  const std::vector<std::tuple<const char*, double, double>> phases = {
      {"tokenize", 10'000, 1'000}, {"queue", 11'000, 2'000}, {"prefill", 13'000, 2'000}, {"decode", 15'000, 4'000}};
  for (const auto& [name, ts, dur] : phases) {
    const json* p = find_event(events, name, 1, 1);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_DOUBLE_EQ((*p)["ts"].get<double>(), ts) << name;
    EXPECT_DOUBLE_EQ((*p)["dur"].get<double>(), dur) << name;
  }

  // Steps: on their instance's process, and on each known request's thread.
  const json* on_instance = find_event(events, "step 1P+0D", 102, 1);
  ASSERT_NE(on_instance, nullptr);
  EXPECT_DOUBLE_EQ((*on_instance)["ts"].get<double>(), 23'000.0);
  EXPECT_EQ((*on_instance)["args"]["request_ids"], json::array({"7", "99"}));
  EXPECT_EQ((*on_instance)["args"]["prefill_tokens"], 4);
  EXPECT_NE(find_event(events, "step 41", 1, 1), nullptr);
  EXPECT_NE(find_event(events, "step 42", 1, 2), nullptr);
}

TEST(chrome_trace, a_request_never_scheduled_has_only_its_tokenize_phase_and_a_kv_hook_has_room) {
  request_record r = record(3, 50 * ms);
  r.timeline.num_steps = 0;
  r.num_output_tokens = 0;
  r.first_token = r.finish;
  const std::vector<request_phase> phases = request_phases(r);
  ASSERT_EQ(phases.size(), 1u);
  EXPECT_STREQ(phases[0].name, "tokenize");
  // Phases never leave the request's own span, even when the stages' durations add up to more.
  request_record late = record(4, 50 * ms);
  late.timeline.queue_ns = 100 * ms;
  for (const request_phase& p : request_phases(late)) {
    EXPECT_GE(p.begin, late.arrival) << p.name;
    EXPECT_LE(p.end, late.finish) << p.name;
    EXPECT_LE(p.begin, p.end) << p.name;
  }
}

TEST(chrome_trace, a_disaggregated_request_shows_its_kv_transfer_between_reservation_and_landing) {
  request_record r = record(5, 10 * ms);
  r.timeline.kv_reserved_ns = 1 * ms;  // the decode half's clock, from its receipt (after tokenize)
  r.timeline.kv_landed_ns = 3 * ms;
  const std::vector<request_phase> phases = request_phases(r);
  const auto kv = std::find_if(phases.begin(), phases.end(),
                               [](const request_phase& p) { return std::string(p.name) == "kv_transfer"; });
  ASSERT_NE(kv, phases.end());
  EXPECT_EQ(kv->begin, r.arrival + 2 * ms);
  EXPECT_EQ(kv->end, r.arrival + 4 * ms);
  // A request computed whole on one instance has none.
  for (const request_phase& p : request_phases(record(6, 10 * ms))) EXPECT_STRNE(p.name, "kv_transfer");
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

TEST(chrome_trace, a_speculating_requests_span_names_its_drafts_and_a_plain_one_does_not) {
  trace_window w;
  w.begin = 0;
  w.end = 100 * ms;
  request_record speculating = record(1, 10 * ms);
  speculating.num_draft_tokens = 16;
  speculating.num_accepted_tokens = 12;
  w.requests = {speculating, record(2, 20 * ms)};
  const json events = json::parse(build_chrome_trace(w)).at("traceEvents");
  const json* with = find_event(events, "request", 1, 1);
  const json* without = find_event(events, "request", 1, 2);
  ASSERT_TRUE(with && without);
  EXPECT_EQ((*with)["args"]["draft_tokens"], 16);
  EXPECT_EQ((*with)["args"]["accepted_tokens"], 12);
  EXPECT_FALSE((*without)["args"].contains("draft_tokens"));
}

}  // namespace
}  // namespace troupe
