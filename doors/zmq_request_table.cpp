#include "doors/zmq_request_table.hpp"

#include <spdlog/spdlog.h>

#include "doors/speculative_usage.hpp"

namespace troupe {

namespace {

double seconds(duration_ns d) { return static_cast<double>(d) / 1e9; }
double ms(duration_ns d) { return static_cast<double>(d) / 1e6; }

// The door's own segments of a request, on its clock: arrival -> first tokens, arrival -> final.
struct door_timing {
  duration_ns ttft_ns = 0;
  duration_ns e2e_ns = 0;
};

delta_reply to_reply(const std::string& client_id, const text_delta& d, bool want_logprobs, bool with_prompt_logprobs,
                     const door_timing& door) {
  delta_reply r;
  r.id = client_id;
  r.text = d.text;
  r.token_ids = d.delta.token_ids;
  if (with_prompt_logprobs) {
    r.prompt_logprobs.emplace();
    for (const auto& lp : d.delta.prompt_logprobs) {
      prompt_logprob out{lp.token_id, lp.logprob, lp.rank, {}};
      for (size_t k = 0; k < lp.top_token_ids.size() && k < lp.top_logprobs.size(); ++k) {
        out.top.emplace_back(lp.top_token_ids[k], lp.top_logprobs[k]);
      }
      r.prompt_logprobs->push_back(std::move(out));
    }
  }
  if (want_logprobs) {
    r.logprobs.emplace();
    for (size_t i = 0; i < d.delta.token_ids.size() && i < d.delta.logprobs.size(); ++i) {
      const auto& lp = d.delta.logprobs[i];
      token_logprob out{d.delta.token_ids[i], lp.logprob, {}};
      for (size_t k = 0; k < lp.top_token_ids.size() && k < lp.top_logprobs.size(); ++k) {
        out.top.emplace_back(lp.top_token_ids[k], lp.top_logprobs[k]);
      }
      r.logprobs->push_back(std::move(out));
    }
  }
  if (d.delta.finished()) {
    r.finish_reason = std::string(finish_reason_name(d.delta.finish));
    if (d.delta.metrics) {
      const auto& m = *d.delta.metrics;
      r.usage = usage_info{m.num_prompt_tokens, m.num_output_tokens, m.num_preemptions, speculative_usage_of(m)};
      // queue and tpot are the scheduler's segments (its clock); ttft and e2e the door's.
      r.timings = timing_info{m.queue_time, seconds(door.ttft_ns), m.tpot, seconds(door.e2e_ns)};
    } else {
      r.usage = usage_info{};
      r.timings = timing_info{0.0, seconds(door.ttft_ns), 0.0, seconds(door.e2e_ns)};
    }
  }
  return r;
}

// Each figure is one clock's: the tokenizer's, the scheduler's (from its receipt), the worker's,
// the door's (from arrival).
void log_finished(const text_delta& d, const std::string& client_id, const door_timing& door) {
  const auto& t = d.timeline;
  spdlog::debug(
      "request {} ('{}') {}: tokenize {:.3f} ms; scheduler: queue {:.3f} ms, first step done +{:.3f} ms, last "
      "+{:.3f} ms, {} steps; worker: first step {:.3f} ms; door: ttft {:.3f} ms, e2e {:.3f} ms",
      d.delta.request_id, client_id, finish_reason_name(d.delta.finish), ms(t.tokenize_ns), ms(t.queue_ns),
      ms(t.first_step_done_ns), ms(t.last_step_done_ns), t.num_steps, ms(t.first_step_compute_ns), ms(door.ttft_ns),
      ms(door.e2e_ns));
}

}  // namespace

zmq_request_table::zmq_request_table(request_admission& admission, int max_prompt_tokens)
    : admission_(admission), max_prompt_tokens_(max_prompt_tokens) {}

void zmq_request_table::refuse(outputs& out, const std::string& routing_id, std::string id, error_code code,
                               std::string message) {
  out.replies.push_back({routing_id, error_reply{std::move(id), code, std::move(message)}});
}

zmq_request_table::outputs zmq_request_table::on_request(const std::string& routing_id, client_request request,
                                                         timestamp_ns arrival) {
  outputs out;
  if (auto* abort = std::get_if<abort_request>(&request)) {
    auto it = by_client_id_.find({routing_id, abort->id});
    if (it == by_client_id_.end()) {
      refuse(out, routing_id, abort->id, error_code::not_found,
             "abort: no request '" + abort->id + "' is in flight for this client");
    } else {
      out.aborts.push_back(it->second);
    }
    return out;
  }
  if (auto* stats = std::get_if<stats_request>(&request)) {
    if (stats_waiters_.size() >= max_stats_waiters) {
      refuse(out, routing_id, stats->id, error_code::overloaded, "too many stats requests pending");
      return out;
    }
    const uint64_t tag = admission_.next_stats_tag(client_door::zmq);
    stats_waiters_[tag] = {routing_id, stats->id};
    out.stats_query = tag;
    return out;
  }
  auto& generate = std::get<generate_request>(request);
  auto refuse_generate = [&](error_code code, std::string message) {
    out.refusals.push_back(refusal_entry{client_door::zmq, generate.id, error_code_name(code), 0, message});
    refuse(out, routing_id, generate.id, code, std::move(message));
  };
  if (by_client_id_.count({routing_id, generate.id})) {
    refuse_generate(error_code::duplicate_id,
                    "field 'id': request '" + generate.id + "' is still in flight for this client");
    return out;
  }
  if (generate.prompt_token_ids && generate.prompt_token_ids->size() >= static_cast<size_t>(max_prompt_tokens_)) {
    refuse_generate(error_code::prompt_too_long,
                    "field 'prompt_token_ids': " + std::to_string(generate.prompt_token_ids->size()) +
                        " tokens leave no room to generate within the context of " +
                        std::to_string(max_prompt_tokens_) + " tokens");
    return out;
  }
  // A draining server takes no new work: the client should go to another server now.
  if (auto closed = admission_.closed_reason()) {
    refuse_generate(error_code::unavailable, *closed);
    return out;
  }
  const auto admitted = admission_.admit(client_door::zmq);
  if (!admitted) {
    refuse_generate(error_code::overloaded, "the server holds " + std::to_string(admission_.max_in_flight()) +
                                                " requests already; retry later");
    return out;
  }
  const int64_t request_id = *admitted;
  live_request live;
  live.routing_id = routing_id;
  live.client_id = generate.id;
  live.stream = generate.stream;
  live.want_logprobs = generate.sampling.logprobs >= 0;
  live.want_prompt_logprobs = generate.sampling.prompt_logprobs >= 0;
  live.arrival = arrival;
  live.pending.id = generate.id;
  requests_.emplace(request_id, std::move(live));
  by_client_id_[{routing_id, generate.id}] = request_id;
  by_routing_id_[routing_id].insert(request_id);

  tokenize_request& job = out.submit.emplace();
  job.request_id = request_id;
  if (generate.prompt) {
    job.kind = prompt_kind::text;
    job.prompt = std::move(*generate.prompt);
  } else if (generate.prompt_token_ids) {
    job.kind = prompt_kind::token_ids;
    job.prompt_token_ids = std::move(*generate.prompt_token_ids);
  } else {
    job.kind = prompt_kind::messages;
    job.messages = std::move(*generate.messages);
  }
  job.sampling = std::move(generate.sampling);
  job.priority = generate.priority;
  job.targets = std::move(generate.targets);
  return out;
}

zmq_request_table::outputs zmq_request_table::on_event(const door_event& event, timestamp_ns now) {
  outputs out;
  if (auto* batch = std::get_if<text_batch>(&event)) {
    for (const auto& d : batch->deltas) on_text(d, now, out);
  } else if (auto* failed = std::get_if<request_failed>(&event)) {
    auto it = requests_.find(failed->request_id);
    if (it == requests_.end()) return out;
    if (!it->second.client_gone) {
      refuse(out, it->second.routing_id, it->second.client_id, failed->code, failed->message);
    }
    forget(failed->request_id);
  } else if (auto* stats = std::get_if<stats_answer>(&event)) {
    auto it = stats_waiters_.find(stats->tag);
    if (it == stats_waiters_.end()) return out;
    if (!stats->unavailable.empty()) {
      refuse(out, it->second.routing_id, std::move(it->second.id), error_code::internal, stats->unavailable);
      stats_waiters_.erase(it);
      return out;
    }
    out.replies.push_back(
        {std::move(it->second.routing_id),
         stats_reply{std::move(it->second.id), stats->num_free_blocks, stats->num_total_blocks, stats->num_running,
                     stats->num_waiting, static_cast<int>(admission_.num_in_flight()), stats->num_waiting_for_kv,
                     stats->num_kv_leases}});
    stats_waiters_.erase(it);
  }
  return out;
}

void zmq_request_table::on_text(const text_delta& d, timestamp_ns now, outputs& out) {
  auto it = requests_.find(d.delta.request_id);
  if (it == requests_.end()) return;
  auto& live = it->second;
  const bool finished = d.delta.finished();
  // A request that finishes with no token (an abort in the queue) had its first reply at the end.
  if (live.first_tokens == 0 && (!d.delta.token_ids.empty() || finished)) live.first_tokens = now;
  const door_timing door{live.first_tokens - live.arrival, finished ? now - live.arrival : 0};
  if (!live.client_gone) {
    // The prompt's logprobs ride with the first token (the engine attaches them there).
    const bool with_prompt_logprobs = live.want_prompt_logprobs && !d.delta.token_ids.empty();
    live.want_prompt_logprobs = live.want_prompt_logprobs && !with_prompt_logprobs;
    delta_reply reply = to_reply(live.client_id, d, live.want_logprobs, with_prompt_logprobs, door);
    if (live.stream) {
      if (finished || !reply.token_ids.empty() || !reply.text.empty()) {
        out.replies.push_back({live.routing_id, std::move(reply)});
      }
    } else {
      auto& all = live.pending;
      all.text += reply.text;
      all.token_ids.insert(all.token_ids.end(), reply.token_ids.begin(), reply.token_ids.end());
      if (reply.prompt_logprobs) all.prompt_logprobs = std::move(reply.prompt_logprobs);
      if (reply.logprobs) {
        if (!all.logprobs) all.logprobs.emplace();
        all.logprobs->insert(all.logprobs->end(), reply.logprobs->begin(), reply.logprobs->end());
      }
      if (finished) {
        all.finish_reason = std::move(reply.finish_reason);
        all.usage = reply.usage;
        all.timings = reply.timings;
        out.replies.push_back({live.routing_id, std::move(all)});
      }
    }
  }
  if (finished) {
    log_finished(d, live.client_id, door);
    forget(d.delta.request_id);
  }
}

void zmq_request_table::forget(int64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  by_client_id_.erase({it->second.routing_id, it->second.client_id});
  auto by_peer = by_routing_id_.find(it->second.routing_id);
  if (by_peer != by_routing_id_.end()) {
    by_peer->second.erase(request_id);
    if (by_peer->second.empty()) by_routing_id_.erase(by_peer);
  }
  requests_.erase(it);
  admission_.release();
}

void zmq_request_table::gone(const std::string& routing_id, outputs& out) {
  auto by_peer = by_routing_id_.find(routing_id);
  if (by_peer == by_routing_id_.end()) return;
  for (int64_t request_id : by_peer->second) {
    auto& live = requests_.at(request_id);
    if (live.client_gone) continue;
    live.client_gone = true;
    spdlog::debug("client of request {} ('{}') disconnected: aborting", request_id, live.client_id);
    out.aborts.push_back(request_id);
  }
}

zmq_request_table::outputs zmq_request_table::on_client_gone(const std::string& routing_id) {
  outputs out;
  gone(routing_id, out);
  return out;
}

bool zmq_request_table::knows_peer(int fd, const std::string& routing_id) const {
  auto it = routing_ids_by_fd_.find(fd);
  return it != routing_ids_by_fd_.end() && it->second.count(routing_id);
}

void zmq_request_table::add_peer(int fd, const std::string& routing_id) { routing_ids_by_fd_[fd].insert(routing_id); }

zmq_request_table::outputs zmq_request_table::on_disconnected(int fd) {
  outputs out;
  auto it = routing_ids_by_fd_.find(fd);
  if (it == routing_ids_by_fd_.end()) return out;
  for (const auto& routing_id : it->second) gone(routing_id, out);
  routing_ids_by_fd_.erase(it);
  return out;
}

}  // namespace troupe
