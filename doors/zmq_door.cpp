#include "doors/zmq_door.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "doors/api_key.hpp"
#include "protocol/codec.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

namespace {

double ms_between(timestamp_ns from, timestamp_ns to) {
  return from == 0 || to == 0 ? -1.0 : (to - from) / 1e6;
}

}  // namespace

struct zmq_door::state {
  struct live_request {
    std::string routing_id;
    std::string client_id;
    bool stream = true;
    bool want_logprobs = false;
    bool client_gone = false;
    delta_reply pending;  // the whole completion so far when not streaming
  };

  zmq::context_t context{1};
  zmq::socket_t router{context, zmq::socket_type::router};
  zmq::socket_t monitor{context, zmq::socket_type::pair};
  int wake_fd = -1;

  std::mutex inbox_mutex;
  std::vector<door_event> inbox;

  std::unordered_map<int64_t, live_request> requests;
  std::map<std::pair<std::string, std::string>, int64_t> by_client_id;
  std::unordered_map<std::string, std::unordered_set<int64_t>> by_routing_id;
  std::unordered_map<int, std::unordered_set<std::string>> routing_ids_by_fd;
  std::unordered_map<uint64_t, std::pair<std::string, std::string>> stats_waiters;  // tag -> (routing id, id)

  ~state() {
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void send_reply(const std::string& routing_id, const server_reply& reply) {
    std::string payload = encode_reply(reply);
    // ROUTER drops messages for unknown or gone peers; never blocks with dontwait.
    if (!router.send(zmq::buffer(routing_id), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return;
    (void)router.send(zmq::buffer(payload), zmq::send_flags::dontwait);
  }

  void send_error(const std::string& routing_id, std::string id, error_code code, std::string message) {
    send_reply(routing_id, error_reply{std::move(id), code, std::move(message)});
  }
};

zmq_door::zmq_door(zmq_door_options options, door_downstream& downstream, request_admission& admission)
    : options_(std::move(options)),
      downstream_(downstream),
      admission_(admission),
      state_(std::make_unique<state>()) {}

zmq_door::~zmq_door() { stop(); }

void zmq_door::start() {
  auto& s = *state_;
  s.router.set(zmq::sockopt::linger, 0);
  s.router.set(zmq::sockopt::rcvhwm, 100000);
  s.router.set(zmq::sockopt::sndhwm, 100000);
  // Frames above max_frame_bytes get an error reply; frames far above it cost the peer its
  // connection, before libzmq buffers them whole.
  s.router.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options_.limits.max_frame_bytes) * 4);
  try {
    s.router.bind(options_.endpoint);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error("zmq door: cannot bind " + options_.endpoint + ": " + e.what());
  }
  std::string monitor_endpoint = "inproc://troupe-frontend-monitor-" + std::to_string(reinterpret_cast<uintptr_t>(this));
  if (zmq_socket_monitor(s.router.handle(), monitor_endpoint.c_str(), ZMQ_EVENT_DISCONNECTED) != 0) {
    throw std::runtime_error("zmq door: cannot monitor the ROUTER socket: " + std::string(zmq_strerror(zmq_errno())));
  }
  s.monitor.connect(monitor_endpoint);
  s.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.wake_fd < 0) throw std::runtime_error("zmq door: eventfd failed");
  thread_ = std::thread([this] { loop(); });
}

void zmq_door::stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  uint64_t one = 1;
  (void)::write(state_->wake_fd, &one, sizeof one);
  thread_.join();
}

void zmq_door::post(door_event event) {
  {
    std::lock_guard lock(state_->inbox_mutex);
    state_->inbox.push_back(std::move(event));
  }
  uint64_t one = 1;
  (void)::write(state_->wake_fd, &one, sizeof one);
}

namespace {

delta_reply to_reply(const std::string& client_id, const text_delta& d, bool want_logprobs) {
  delta_reply r;
  r.id = client_id;
  r.text = d.text;
  r.token_ids = d.delta.token_ids;
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
      r.usage = usage_info{m.num_prompt_tokens, m.num_output_tokens, m.num_preemptions};
      r.timings = timing_info{m.queue_time, m.ttft, m.tpot, m.e2e};
    } else {
      r.usage = usage_info{};
      r.timings = timing_info{};
    }
  }
  return r;
}

}  // namespace

void zmq_door::loop() {
  auto& s = *state_;
  const auto& limits = options_.limits;

  auto forget = [&](int64_t request_id) {
    auto it = s.requests.find(request_id);
    if (it == s.requests.end()) return;
    s.by_client_id.erase({it->second.routing_id, it->second.client_id});
    auto by_peer = s.by_routing_id.find(it->second.routing_id);
    if (by_peer != s.by_routing_id.end()) {
      by_peer->second.erase(request_id);
      if (by_peer->second.empty()) s.by_routing_id.erase(by_peer);
    }
    s.requests.erase(it);
    admission_.release();
  };

  auto on_request = [&](const std::string& routing_id, std::string_view frame) {
    auto decoded = decode_request(frame, limits);
    if (auto* error = std::get_if<protocol_error>(&decoded)) {
      s.send_error(routing_id, error->id, error->code, error->message);
      return;
    }
    auto& request = std::get<client_request>(decoded);
    const std::string& api_key = std::visit([](auto& r) -> const std::string& { return r.api_key; }, request);
    const std::string& id = std::visit([](auto& r) -> const std::string& { return r.id; }, request);
    if (!options_.api_key.empty() && !api_key_matches(api_key, options_.api_key)) {
      s.send_error(routing_id, id, error_code::unauthorized,
                   api_key.empty() ? "field 'api_key': missing (this server requires a key)"
                                   : "field 'api_key': wrong key");
      return;
    }
    if (auto* abort = std::get_if<abort_request>(&request)) {
      auto it = s.by_client_id.find({routing_id, abort->id});
      if (it == s.by_client_id.end()) {
        s.send_error(routing_id, abort->id, error_code::not_found,
                     "abort: no request '" + abort->id + "' is in flight for this client");
        return;
      }
      downstream_.abort(it->second);
      return;
    }
    if (auto* stats = std::get_if<stats_request>(&request)) {
      uint64_t tag = admission_.next_stats_tag(client_door::zmq);
      if (s.stats_waiters.size() >= 1024) {
        s.send_error(routing_id, stats->id, error_code::overloaded, "too many stats requests pending");
        return;
      }
      s.stats_waiters[tag] = {routing_id, stats->id};
      downstream_.query_stats(tag);
      return;
    }
    auto& generate = std::get<generate_request>(request);
    if (s.by_client_id.count({routing_id, generate.id})) {
      s.send_error(routing_id, generate.id, error_code::duplicate_id,
                   "field 'id': request '" + generate.id + "' is still in flight for this client");
      return;
    }
    if (generate.prompt_token_ids &&
        generate.prompt_token_ids->size() >= static_cast<size_t>(options_.max_prompt_tokens)) {
      s.send_error(routing_id, generate.id, error_code::prompt_too_long,
                   "field 'prompt_token_ids': " + std::to_string(generate.prompt_token_ids->size()) +
                       " tokens leave no room to generate within the context of " +
                       std::to_string(options_.max_prompt_tokens) + " tokens");
      return;
    }
    const auto admitted = admission_.admit(client_door::zmq);
    if (!admitted) {
      s.send_error(routing_id, generate.id, error_code::overloaded,
                   "the server holds " + std::to_string(admission_.max_in_flight()) +
                       " requests already; retry later");
      return;
    }
    const int64_t request_id = *admitted;
    state::live_request live;
    live.routing_id = routing_id;
    live.client_id = generate.id;
    live.stream = generate.stream;
    live.want_logprobs = generate.sampling.logprobs >= 0;
    live.pending.id = generate.id;
    s.requests.emplace(request_id, std::move(live));
    s.by_client_id[{routing_id, generate.id}] = request_id;
    s.by_routing_id[routing_id].insert(request_id);

    tokenize_request job;
    job.request_id = request_id;
    job.arrival = steady_now_ns();
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
    downstream_.submit(std::move(job));
  };

  auto on_text = [&](const text_delta& d) {
    auto it = s.requests.find(d.delta.request_id);
    if (it == s.requests.end()) return;
    auto& live = it->second;
    const bool finished = d.delta.finished();
    if (!live.client_gone) {
      delta_reply reply = to_reply(live.client_id, d, live.want_logprobs);
      if (live.stream) {
        if (finished || !reply.token_ids.empty() || !reply.text.empty()) s.send_reply(live.routing_id, reply);
      } else {
        auto& all = live.pending;
        all.text += reply.text;
        all.token_ids.insert(all.token_ids.end(), reply.token_ids.begin(), reply.token_ids.end());
        if (reply.logprobs) {
          if (!all.logprobs) all.logprobs.emplace();
          all.logprobs->insert(all.logprobs->end(), reply.logprobs->begin(), reply.logprobs->end());
        }
        if (finished) {
          all.finish_reason = reply.finish_reason;
          all.usage = reply.usage;
          all.timings = reply.timings;
          s.send_reply(live.routing_id, all);
        }
      }
    }
    if (finished) {
      const auto& t = d.timeline;
      spdlog::debug(
          "request {} ('{}') {}: tokenized +{:.3f} ms, first scheduled +{:.3f} ms, first step "
          "+{:.3f}..+{:.3f} ms, last step end +{:.3f} ms, {} steps, ttft {:.3f} ms, e2e {:.3f} ms",
          d.delta.request_id, live.client_id, finish_reason_name(d.delta.finish),
          ms_between(t.arrival, t.tokenized), ms_between(t.arrival, t.first_scheduled),
          ms_between(t.arrival, t.first_step_begin), ms_between(t.arrival, t.first_step_end),
          ms_between(t.arrival, t.last_step_end), t.num_steps,
          d.delta.metrics ? d.delta.metrics->ttft * 1e3 : -1.0, d.delta.metrics ? d.delta.metrics->e2e * 1e3 : -1.0);
      forget(d.delta.request_id);
    }
  };

  auto on_event = [&](door_event& event) {
    if (auto* batch = std::get_if<text_batch>(&event)) {
      for (const auto& d : batch->deltas) on_text(d);
    } else if (auto* failed = std::get_if<request_failed>(&event)) {
      auto it = s.requests.find(failed->request_id);
      if (it == s.requests.end()) return;
      if (!it->second.client_gone) {
        s.send_error(it->second.routing_id, it->second.client_id, failed->code, failed->message);
      }
      forget(failed->request_id);
    } else if (auto* stats = std::get_if<stats_answer>(&event)) {
      auto it = s.stats_waiters.find(stats->tag);
      if (it == s.stats_waiters.end()) return;
      s.send_reply(it->second.first,
                   stats_reply{it->second.second, stats->num_free_blocks, stats->num_total_blocks,
                               stats->num_running, stats->num_waiting,
                               static_cast<int>(admission_.num_in_flight())});
      s.stats_waiters.erase(it);
    }
  };

  auto on_disconnect = [&](int fd) {
    auto it = s.routing_ids_by_fd.find(fd);
    if (it == s.routing_ids_by_fd.end()) return;
    for (const auto& routing_id : it->second) {
      auto by_peer = s.by_routing_id.find(routing_id);
      if (by_peer == s.by_routing_id.end()) continue;
      for (int64_t request_id : by_peer->second) {
        auto& live = s.requests.at(request_id);
        if (live.client_gone) continue;
        live.client_gone = true;
        spdlog::debug("client of request {} ('{}') disconnected: aborting", request_id, live.client_id);
        downstream_.abort(request_id);
      }
    }
    s.routing_ids_by_fd.erase(it);
  };

  // Handles every disconnect event queued so far.
  auto drain_monitor = [&] {
    for (;;) {
      zmq::message_t event_frame, address_frame;
      if (!s.monitor.recv(event_frame, zmq::recv_flags::dontwait)) return;
      if (event_frame.more()) (void)s.monitor.recv(address_frame, zmq::recv_flags::dontwait);
      if (event_frame.size() >= 6) {
        uint16_t event_id;
        uint32_t value;
        std::memcpy(&event_id, event_frame.data(), 2);
        std::memcpy(&value, static_cast<const char*>(event_frame.data()) + 2, 4);
        if (event_id == ZMQ_EVENT_DISCONNECTED) on_disconnect(static_cast<int>(value));
      }
    }
  };

  zmq::pollitem_t items[3] = {
      {s.router.handle(), 0, ZMQ_POLLIN, 0},
      {s.monitor.handle(), 0, ZMQ_POLLIN, 0},
      {nullptr, s.wake_fd, ZMQ_POLLIN, 0},
  };
  std::vector<zmq::message_t> parts;
  while (!stopping_) {
    try {
      zmq::poll(items, 3, std::chrono::milliseconds(200));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    if (items[2].revents & ZMQ_POLLIN) {
      uint64_t count = 0;
      (void)::read(s.wake_fd, &count, sizeof count);
      std::vector<door_event> events;
      {
        std::lock_guard lock(s.inbox_mutex);
        events.swap(s.inbox);
      }
      for (auto& event : events) on_event(event);
    }
    if (items[1].revents & ZMQ_POLLIN) drain_monitor();
    if (items[0].revents & ZMQ_POLLIN) {
      // A bounded batch per wakeup, so replies and disconnects are never starved by a flood.
      for (int n = 0; n < 256; ++n) {
        parts.clear();
        zmq::message_t part;
        if (!s.router.recv(part, zmq::recv_flags::dontwait)) break;
        bool more = part.more();
        parts.push_back(std::move(part));
        size_t num_parts = 1;
        while (more) {
          zmq::message_t next;
          (void)s.router.recv(next, zmq::recv_flags::none);
          more = next.more();
          ++num_parts;
          // Keep only the first few parts: a message of thousands of parts costs nothing here.
          if (parts.size() <= limits.max_frames_per_message) parts.push_back(std::move(next));
        }
        const std::string routing_id = parts[0].to_string();
        if (parts.size() < 2) continue;  // a peer with nothing to say
        int fd = parts.back().get(ZMQ_SRCFD);
        if (fd >= 0 && !s.routing_ids_by_fd[fd].count(routing_id)) {
          // A peer new on this descriptor, which may be a closed connection's, reused. That
          // connection's disconnect event was queued before this peer could even connect, but
          // may not be handled yet: handle it now, or it would later be taken for this peer's
          // and silently abort its requests (a client then waits forever for its reply).
          drain_monitor();
          s.routing_ids_by_fd[fd].insert(routing_id);
        }
        if (num_parts > limits.max_frames_per_message ||
            (num_parts == 3 && parts[1].size() != 0)) {
          s.send_error(routing_id, "", error_code::bad_request,
                       "a request is one msgpack frame (optionally after an empty delimiter), got " +
                           std::to_string(num_parts - 1) + " frames");
          continue;
        }
        const auto& payload = parts.back();
        on_request(routing_id, std::string_view(static_cast<const char*>(payload.data()), payload.size()));
      }
    }
  }
}

}  // namespace troupe
