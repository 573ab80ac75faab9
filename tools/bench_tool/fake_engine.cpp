#include "tools/bench_tool/fake_engine.hpp"

#include <algorithm>
#include <cerrno>
#include <sstream>

#include <nlohmann/json.hpp>
#include <zmq_addon.hpp>

#include "protocol/codec.hpp"

namespace troupe::bench_tool {

namespace {

double seconds(fake_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int count_words(const std::string& text) {
  std::istringstream in(text);
  std::string word;
  int n = 0;
  while (in >> word) ++n;
  return std::max(n, 1);
}

fake_engine::fake_engine(const fake_server_settings& settings, zmq::socket_t* socket, engine_inbox& inbox)
    : settings_(settings),
      socket_(socket),
      inbox_(inbox),
      ttft_(std::chrono::duration_cast<fake_clock::duration>(
          std::chrono::duration<double, std::milli>(settings.ttft_ms))),
      tpot_(std::chrono::duration_cast<fake_clock::duration>(
          std::chrono::duration<double, std::milli>(settings.tpot_ms))) {}

void fake_engine::run(const std::atomic<bool>& stop) {
  while (!stop) {
    auto timeout = std::chrono::milliseconds(200);
    const auto now = fake_clock::now();
    for (const auto& r : running_) {
      const auto wait =
          std::chrono::ceil<std::chrono::milliseconds>(std::max(r.next_due - now, fake_clock::duration::zero()));
      timeout = std::min(timeout, wait);
    }
    std::vector<zmq::pollitem_t> items = {{nullptr, inbox_.wake_fd(), ZMQ_POLLIN, 0}};
    if (socket_) items.push_back({socket_->handle(), 0, ZMQ_POLLIN, 0});
    try {
      zmq::poll(items.data(), items.size(), timeout);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;  // SIGTERM: the loop's condition decides
      throw;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      for (auto& h : inbox_.take()) accept_http(std::move(h));
    }
    if (socket_ && (items[1].revents & ZMQ_POLLIN)) receive_zmq();
    admit();
    emit_due();
  }
  // Streams still open end with an error, so no handler waits on.
  for (auto* list : {&waiting_, &running_}) {
    for (auto& r : *list) {
      if (r.stream) finish_stream(r, "data: {\"error\": {\"message\": \"the fake server is stopping\"}}\n\n");
    }
  }
}

void fake_engine::accept_http(http_request h) {
  fake_request r;
  r.id = h.id;
  r.stream = std::move(h.stream);
  r.chat = h.chat;
  r.include_usage = h.include_usage;
  r.prompt_tokens = h.prompt_tokens;
  r.max_tokens = h.max_tokens;
  r.arrival = fake_clock::now();
  waiting_.push_back(std::move(r));
}

void fake_engine::receive_zmq() {
  for (int i = 0; i < 1000; ++i) {  // bounded: the timers must not starve behind a flood
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(*socket_, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
    if (parts.size() < 2) continue;
    const std::string routing_id = parts[0].to_string();
    const bool delimiter = parts.size() == 3 && parts[1].size() == 0;
    if (parts.size() > 3 || (parts.size() == 3 && !delimiter)) {
      reply(routing_id, delimiter, error_reply{"", error_code::bad_request, "a request is one frame"});
      continue;
    }
    handle_zmq(routing_id, delimiter, parts.back().to_string_view());
  }
}

void fake_engine::handle_zmq(const std::string& routing_id, bool delimiter, std::string_view frame) {
  auto decoded = decode_request(frame);
  if (auto* e = std::get_if<protocol_error>(&decoded)) {
    reply(routing_id, delimiter, error_reply{e->id, e->code, e->message});
    return;
  }
  auto& request = std::get<client_request>(decoded);
  if (auto* g = std::get_if<generate_request>(&request)) {
    fake_request r;
    r.id = g->id;
    r.routing_id = routing_id;
    r.delimiter = delimiter;
    r.max_tokens = g->sampling.max_tokens;
    if (g->prompt_token_ids) {
      r.prompt_tokens = static_cast<int>(g->prompt_token_ids->size());
    } else if (g->prompt) {
      r.prompt_tokens = count_words(*g->prompt);
    } else if (g->messages) {
      for (const auto& m : *g->messages) r.prompt_tokens += count_words(m.content);
    }
    r.arrival = fake_clock::now();
    waiting_.push_back(std::move(r));
  } else if (auto* a = std::get_if<abort_request>(&request)) {
    for (auto* list : {&waiting_, &running_}) {
      for (auto it = list->begin(); it != list->end(); ++it) {
        if (!it->stream && it->id == a->id && it->routing_id == routing_id) {
          delta_reply last{it->id,      "", {}, std::nullopt, "abort", usage_info{it->prompt_tokens, it->num_sent, 0},
                           std::nullopt};
          reply(routing_id, delimiter, last);
          list->erase(it);
          return;
        }
      }
    }
    reply(routing_id, delimiter, error_reply{a->id, error_code::not_found, "no request '" + a->id + "' in flight"});
  } else if (auto* s = std::get_if<stats_request>(&request)) {
    reply(routing_id, delimiter,
          stats_reply{s->id, 1024, 1024, static_cast<int>(running_.size()), static_cast<int>(waiting_.size()),
                      static_cast<int>(running_.size() + waiting_.size())});
  }
}

void fake_engine::reply(const std::string& routing_id, bool delimiter, const server_reply& r) {
  const std::string frame = encode_reply(r);
  socket_->send(zmq::buffer(routing_id), zmq::send_flags::sndmore);
  if (delimiter) socket_->send(zmq::message_t(), zmq::send_flags::sndmore);
  socket_->send(zmq::buffer(frame), zmq::send_flags::none);
}

void fake_engine::admit() {
  // Requests whose client went away before they ran are dropped as they come up.
  while (!waiting_.empty() && static_cast<int>(running_.size()) < settings_.max_concurrency) {
    fake_request r = std::move(waiting_.front());
    waiting_.pop_front();
    if (r.stream && r.stream->gone) continue;
    r.admitted = fake_clock::now();
    r.next_due = r.admitted + ttft_;
    running_.push_back(std::move(r));
  }
}

void fake_engine::emit_due() {
  const auto now = fake_clock::now();
  for (auto it = running_.begin(); it != running_.end();) {
    if (it->stream && it->stream->gone) {
      it = running_.erase(it);
      continue;
    }
    if (it->next_due > now) {
      ++it;
      continue;
    }
    ++it->num_sent;
    if (it->num_sent == 1) it->first_token = now;
    const bool last = it->num_sent >= it->max_tokens;
    if (it->stream) {
      send_http_token(*it, last);
    } else {
      send_zmq_token(*it, last, now);
    }
    if (last) {
      it = running_.erase(it);
    } else {
      // On a fixed schedule from admission: a late wake-up does not push later tokens back.
      it->next_due = it->admitted + ttft_ + it->num_sent * tpot_;
      ++it;
    }
  }
  admit();  // freed slots go to the next in line at once, not after the next poll
}

void fake_engine::send_zmq_token(const fake_request& r, bool last, fake_clock::time_point now) {
  delta_reply d;
  d.id = r.id;
  d.text = "tok ";
  d.token_ids = {3 + r.num_sent % 100};
  if (last) {
    d.finish_reason = "length";
    d.usage = usage_info{r.prompt_tokens, r.num_sent, 0};
    timing_info t;
    t.queue = seconds(r.admitted - r.arrival);
    t.ttft = seconds(r.first_token - r.arrival);
    t.tpot = r.num_sent > 1 ? seconds(now - r.first_token) / (r.num_sent - 1) : 0.0;
    t.e2e = seconds(now - r.arrival);
    d.timings = t;
  }
  reply(r.routing_id, r.delimiter, d);
}

void fake_engine::send_http_token(fake_request& r, bool last) {
  nlohmann::json choice = {{"index", 0}, {"finish_reason", last ? nlohmann::json("length") : nlohmann::json(nullptr)}};
  if (r.chat) {
    nlohmann::json delta = {{"content", "tok "}};
    if (r.num_sent == 1) delta["role"] = "assistant";
    choice["delta"] = delta;
  } else {
    choice["text"] = "tok ";
    choice["logprobs"] = nullptr;
  }
  nlohmann::json chunk = {{"id", r.id},
                          {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
                          {"created", 0},
                          {"model", "fake"},
                          {"choices", nlohmann::json::array({choice})}};
  if (r.include_usage) chunk["usage"] = nullptr;
  std::string events = "data: " + chunk.dump() + "\n\n";
  if (last && r.include_usage) {
    nlohmann::json usage_chunk = {{"id", r.id},
                                  {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
                                  {"created", 0},
                                  {"model", "fake"},
                                  {"choices", nlohmann::json::array()},
                                  {"usage",
                                   {{"prompt_tokens", r.prompt_tokens},
                                    {"completion_tokens", r.num_sent},
                                    {"total_tokens", r.prompt_tokens + r.num_sent}}}};
    events += "data: " + usage_chunk.dump() + "\n\n";
  }
  std::lock_guard lock(r.stream->mutex);
  r.stream->text += "tok ";
  r.stream->completion_tokens = r.num_sent;
  r.stream->prompt_tokens = r.prompt_tokens;
  r.stream->events.push_back(std::move(events));
  if (last) {
    r.stream->events.push_back("data: [DONE]\n\n");
    r.stream->finished = true;
  }
  r.stream->changed.notify_all();
}

void fake_engine::finish_stream(fake_request& r, std::string event) {
  std::lock_guard lock(r.stream->mutex);
  r.stream->events.push_back(std::move(event));
  r.stream->events.push_back("data: [DONE]\n\n");
  r.stream->finished = true;
  r.stream->changed.notify_all();
}

}  // namespace troupe::bench_tool
