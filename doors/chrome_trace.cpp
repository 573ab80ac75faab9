#include "doors/chrome_trace.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace troupe {

namespace {

using json = nlohmann::json;

constexpr int requests_pid = 1;
constexpr int first_instance_pid = 100;

double micros(duration_ns d) { return static_cast<double>(d) / 1e3; }

// Whole microseconds from the window's start. Spans that meet (one step's end, the next one's
// start; one phase's end, the next phase's start) must meet exactly for a viewer to nest them:
// begin and end are each floored, and the duration is their difference, with no rounding of a
// sum in between.
int64_t whole_micros(timestamp_ns t, timestamp_ns origin) {
  const duration_ns d = t - origin;
  return d >= 0 ? d / 1000 : -((-d + 999) / 1000);
}

json metadata(const char* what, int pid, int tid, const std::string& name) {
  return json{{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"ts", 0}, {"args", {{"name", name}}}};
}

json complete(const std::string& name, const char* category, int pid, int tid, timestamp_ns begin, timestamp_ns end,
              timestamp_ns origin, json args = json::object()) {
  const int64_t ts = whole_micros(begin, origin);
  const int64_t until = whole_micros(std::max(begin, end), origin);
  return json{{"name", name}, {"cat", category}, {"ph", "X"},         {"pid", pid},
              {"tid", tid},   {"ts", ts},        {"dur", until - ts}, {"args", std::move(args)}};
}

std::string step_name(const step_event& s) {
  return "step " + std::to_string(s.num_prefill_sequences) + "P+" + std::to_string(s.num_decode_sequences) + "D";
}

}  // namespace

std::vector<request_phase> request_phases(const request_record& r) {
  std::vector<request_phase> phases;
  const request_timeline& t = r.timeline;
  const timestamp_ns tokenized = std::min(r.arrival + t.tokenize_ns, r.finish);
  phases.push_back({"tokenize", r.arrival, tokenized});
  if (t.num_steps == 0) return phases;  // never scheduled: ended in the queue
  const timestamp_ns scheduled = std::min(tokenized + t.queue_ns, r.finish);
  phases.push_back({"queue", tokenized, scheduled});
  const timestamp_ns first = std::clamp(r.first_token, scheduled, r.finish);
  phases.push_back({"prefill", scheduled, first});
  if (t.kv_landed_ns > 0) {
    // Disaggregated: the decode half's wait for the KV, from its reservation to the last frame
    // (its clock's durations, placed after the tokenizer's like the queue).
    const timestamp_ns reserved = std::min(tokenized + t.kv_reserved_ns, r.finish);
    const timestamp_ns landed = std::clamp(tokenized + t.kv_landed_ns, reserved, r.finish);
    phases.push_back({"kv_transfer", reserved, landed});
  }
  if (r.num_output_tokens > 1) phases.push_back({"decode", first, r.finish});
  return phases;
}

std::string build_chrome_trace(const trace_window& window) {
  json events = json::array();
  const timestamp_ns origin = window.begin;
  events.push_back(metadata("process_name", requests_pid, 0, "requests"));

  // Each request's thread, and where to find it from a step's request ids.
  std::unordered_map<int64_t, int> tid_of;
  std::unordered_map<int64_t, const request_record*> record_of;
  std::unordered_map<int64_t, std::vector<request_phase>> phases_of;
  int next_tid = 1;
  for (const request_record& r : window.requests) {
    const int tid = next_tid++;
    tid_of[r.request_id] = tid;
    record_of[r.request_id] = &r;
    events.push_back(metadata("thread_name", requests_pid, tid, "request " + std::to_string(r.request_id)));
    json args{{"request_id", std::to_string(r.request_id)},
              {"finish_reason", std::string(finish_reason_name(r.finish_reason_value))},
              {"prompt_tokens", r.num_prompt_tokens},
              {"output_tokens", r.num_output_tokens},
              {"preemptions", r.num_preemptions},
              {"steps", r.timeline.num_steps},
              {"ttft_ms", micros(r.first_token - r.arrival) / 1e3},
              {"e2e_ms", micros(r.finish - r.arrival) / 1e3}};
    if (r.num_draft_tokens > 0) {
      args["draft_tokens"] = r.num_draft_tokens;
      args["accepted_tokens"] = r.num_accepted_tokens;
    }
    events.push_back(complete("request", "request", requests_pid, tid, r.arrival, r.finish, origin, std::move(args)));
    phases_of[r.request_id] = request_phases(r);
    for (const request_phase& p : phases_of[r.request_id]) {
      events.push_back(complete(p.name, "request", requests_pid, tid, p.begin, p.end, origin));
    }
  }

  std::map<int32_t, trace_instance> instance_of;
  for (const trace_instance& i : window.instances) instance_of[i.instance] = i;
  for (const placed_step& p : window.steps)
    instance_of.try_emplace(p.step.instance).first->second.instance = p.step.instance;
  for (const auto& [instance, info] : instance_of) {
    const int pid = first_instance_pid + instance;
    json name =
        metadata("process_name", pid, 0,
                 "scheduler instance " + std::to_string(instance) + (info.node.empty() ? "" : " on " + info.node));
    // How far this row's steps may lie off the requests' clock, for a reader (or a test) to judge
    // a step that seems to poke out of its request.
    name["args"]["clock_error_us"] = static_cast<double>(info.clock_error_ns) / 1e3;
    events.push_back(std::move(name));
    events.push_back(metadata("thread_name", pid, 1, "steps"));
  }
  for (const placed_step& p : window.steps) {
    const step_event& s = p.step;
    const timestamp_ns end = p.start + s.elapsed_ns;
    json ids = json::array();
    for (int64_t id : s.request_ids) ids.push_back(std::to_string(id));
    json args{{"step_id", s.step_id},
              {"prefill_sequences", s.num_prefill_sequences},
              {"decode_sequences", s.num_decode_sequences},
              {"prefill_tokens", s.num_prefill_tokens},
              {"decode_tokens", s.num_decode_tokens},
              {"compute_ms", static_cast<double>(s.compute_ns) / 1e6},
              {"request_ids", std::move(ids)}};
    events.push_back(complete(step_name(s), "step", first_instance_pid + s.instance, 1, p.start, end, origin, args));
    // The step on each of its requests' threads too, clipped to the phase it ends in: a viewer
    // nests a thread's spans by containment, and the placement of the stages' durations on the
    // controller's clock is an estimate that can straddle a phase's edge by a little.
    for (int64_t id : s.request_ids) {
      auto it = record_of.find(id);
      if (it == record_of.end()) continue;
      const request_record& r = *it->second;
      timestamp_ns lo = r.arrival, hi = r.finish;
      for (const request_phase& phase : phases_of[id]) {
        if (phase.begin <= end) {
          lo = phase.begin;
          hi = phase.end;
        }
      }
      const timestamp_ns b = std::clamp(p.start, lo, hi);
      const timestamp_ns e = std::clamp(end, b, hi);
      events.push_back(complete("step " + std::to_string(s.step_id), "step", requests_pid, tid_of[id], b, e, origin,
                                json{{"instance", s.instance}, {"step_id", s.step_id}}));
    }
  }
  json trace{{"traceEvents", std::move(events)},
             {"displayTimeUnit", "ms"},
             {"otherData", {{"window_seconds", static_cast<double>(window.end - window.begin) / 1e9}}}};
  return trace.dump();
}

}  // namespace troupe
