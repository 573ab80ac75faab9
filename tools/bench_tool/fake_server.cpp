#include "tools/bench_tool/fake_server.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "protocol/codec.hpp"

namespace troupe::bench_tool {

namespace {

using fake_clock = std::chrono::steady_clock;

double seconds(fake_clock::duration d) { return std::chrono::duration<double>(d).count(); }

int count_words(const std::string& text) {
  std::istringstream in(text);
  std::string word;
  int n = 0;
  while (in >> word) ++n;
  return std::max(n, 1);
}

// What the engine thread hands an HTTP handler: server-sent events, then the end.
struct http_stream {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::string> events;  // each a whole "data: ...\n\n"
  std::string text;                // all output, for a request that does not stream
  int prompt_tokens = 0;
  int completion_tokens = 0;
  bool finished = false;
  std::atomic<bool> gone{false};   // the client went away: the engine frees its slot
};

struct http_request {
  std::shared_ptr<http_stream> stream;
  std::string id;
  bool chat = false;
  bool include_usage = false;
  int prompt_tokens = 0;
  int max_tokens = 16;
};

// One request, queued or running.
struct fake_request {
  std::string id;
  // ZeroMQ: whom to answer, and whether the client framed its request REQ-style.
  std::string routing_id;
  bool delimiter = false;
  // HTTP: where the events go.
  std::shared_ptr<http_stream> stream;
  bool chat = false;
  bool include_usage = false;
  int prompt_tokens = 0;
  int max_tokens = 16;
  int num_sent = 0;
  fake_clock::time_point arrival, admitted, first_token, next_due;
};

// The HTTP handlers' way into the engine thread: a queue and a pipe that wakes its poll.
class engine_inbox {
 public:
  engine_inbox() {
    if (::pipe(fds_) != 0) throw std::runtime_error("fake server: cannot make a pipe");
    ::fcntl(fds_[0], F_SETFL, O_NONBLOCK);
    ::fcntl(fds_[1], F_SETFL, O_NONBLOCK);
  }
  ~engine_inbox() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  void push(http_request r) {
    {
      std::lock_guard lock(mutex_);
      requests_.push_back(std::move(r));
    }
    const char byte = 1;
    [[maybe_unused]] auto n = ::write(fds_[1], &byte, 1);  // full pipe: a wake-up is pending anyway
  }
  std::vector<http_request> take() {
    char buffer[256];
    while (::read(fds_[0], buffer, sizeof buffer) > 0) {
    }
    std::lock_guard lock(mutex_);
    std::vector<http_request> out(std::make_move_iterator(requests_.begin()), std::make_move_iterator(requests_.end()));
    requests_.clear();
    return out;
  }
  int wake_fd() const { return fds_[0]; }

 private:
  int fds_[2] = {-1, -1};
  std::mutex mutex_;
  std::deque<http_request> requests_;
};

nlohmann::json openai_error(const std::string& message, const std::string& param) {
  return {{"error", {{"message", message}, {"type", "invalid_request_error"}, {"param", param}, {"code", nullptr}}}};
}

class fake_engine {
 public:
  fake_engine(const fake_server_settings& settings, zmq::socket_t* socket, engine_inbox& inbox)
      : settings_(settings), socket_(socket), inbox_(inbox),
        ttft_(std::chrono::duration_cast<fake_clock::duration>(std::chrono::duration<double, std::milli>(settings.ttft_ms))),
        tpot_(std::chrono::duration_cast<fake_clock::duration>(std::chrono::duration<double, std::milli>(settings.tpot_ms))) {}

  void run(const std::atomic<bool>& stop) {
    while (!stop) {
      auto timeout = std::chrono::milliseconds(200);
      const auto now = fake_clock::now();
      for (const auto& r : running_) {
        const auto wait = std::chrono::ceil<std::chrono::milliseconds>(std::max(r.next_due - now, fake_clock::duration::zero()));
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

 private:
  void accept_http(http_request h) {
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

  void receive_zmq() {
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

  void handle_zmq(const std::string& routing_id, bool delimiter, std::string_view frame) {
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
            delta_reply last{it->id, "", {}, std::nullopt, "abort", usage_info{it->prompt_tokens, it->num_sent, 0}, std::nullopt};
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

  void reply(const std::string& routing_id, bool delimiter, const server_reply& r) {
    const std::string frame = encode_reply(r);
    socket_->send(zmq::buffer(routing_id), zmq::send_flags::sndmore);
    if (delimiter) socket_->send(zmq::message_t(), zmq::send_flags::sndmore);
    socket_->send(zmq::buffer(frame), zmq::send_flags::none);
  }

  void admit() {
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

  void emit_due() {
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

  void send_zmq_token(const fake_request& r, bool last, fake_clock::time_point now) {
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

  void send_http_token(fake_request& r, bool last) {
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
                                    {"usage", {{"prompt_tokens", r.prompt_tokens},
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

  void finish_stream(fake_request& r, std::string event) {
    std::lock_guard lock(r.stream->mutex);
    r.stream->events.push_back(std::move(event));
    r.stream->events.push_back("data: [DONE]\n\n");
    r.stream->finished = true;
    r.stream->changed.notify_all();
  }

  const fake_server_settings& settings_;
  zmq::socket_t* socket_;
  engine_inbox& inbox_;
  fake_clock::duration ttft_, tpot_;
  std::deque<fake_request> waiting_;
  std::deque<fake_request> running_;
};

// Reads an OpenAI request body into what the engine needs; an error names the field.
std::optional<nlohmann::json> parse_openai(const std::string& body, bool chat, http_request& out) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception&) {
    return openai_error("the body is not JSON", "");
  }
  if (!j.is_object()) return openai_error("the body is not a JSON object", "");
  if (chat) {
    if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
      return openai_error("'messages' must be a non-empty array", "messages");
    }
    for (const auto& m : j["messages"]) {
      if (!m.is_object() || !m.contains("content") || !m["content"].is_string()) {
        return openai_error("each message needs a string 'content'", "messages");
      }
      out.prompt_tokens += count_words(m["content"]);
    }
  } else {
    if (!j.contains("prompt")) return openai_error("'prompt' is required", "prompt");
    const auto& p = j["prompt"];
    if (p.is_string()) {
      out.prompt_tokens = count_words(p);
    } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const auto& v) { return v.is_number_integer(); })) {
      out.prompt_tokens = static_cast<int>(p.size());
    } else {
      return openai_error("'prompt' must be a string or an array of token ids (one prompt)", "prompt");
    }
  }
  const char* max_field = chat && j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (j.contains(max_field)) {
    if (!j[max_field].is_number_integer() || j[max_field].get<long long>() < 1 || j[max_field].get<long long>() > 1000000) {
      return openai_error(std::string("'") + max_field + "' must be an integer in 1..1000000", max_field);
    }
    out.max_tokens = j[max_field].get<int>();
  }
  if (j.contains("stream_options") && j["stream_options"].is_object()) {
    out.include_usage = j["stream_options"].value("include_usage", false);
  }
  return std::nullopt;
}

}  // namespace

int run_fake_server(const fake_server_settings& settings, const std::atomic<bool>& stop) {
  if (settings.max_concurrency < 1) {
    std::fprintf(stderr, "--max-concurrency must be at least 1 for the fake server\n");
    return 2;
  }
  if (!(settings.ttft_ms >= 0) || !(settings.tpot_ms >= 0)) {
    std::fprintf(stderr, "--ttft-ms and --tpot-ms must be 0 or more\n");
    return 2;
  }
  if (settings.zmq_endpoint.empty() && settings.http_port < 0) {
    std::fprintf(stderr, "the fake server needs --zmq-endpoint, --http-port or both\n");
    return 2;
  }
  zmq::context_t context{1};
  std::optional<zmq::socket_t> socket;
  if (!settings.zmq_endpoint.empty()) {
    socket.emplace(context, zmq::socket_type::router);
    socket->set(zmq::sockopt::linger, 0);
    try {
      socket->bind(settings.zmq_endpoint);
    } catch (const zmq::error_t& e) {
      std::fprintf(stderr, "fake server: cannot bind %s: %s\n", settings.zmq_endpoint.c_str(), e.what());
      return 1;
    }
  }
  engine_inbox inbox;
  int http_port = -1;
  httplib::Server http;
  // Stops and joins the HTTP thread however this function ends (an exception included).
  struct http_thread_guard {
    httplib::Server& server;
    std::thread thread;
    ~http_thread_guard() {
      if (thread.joinable()) {
        server.stop();
        thread.join();
      }
    }
  } http_runner{http, {}};
  std::atomic<uint64_t> num_http_requests{0};
  if (settings.http_port >= 0) {
    // Every open stream holds a thread: enough that the queue is the engine's, never httplib's.
    http.new_task_queue = [] { return new httplib::ThreadPool(256); };
    http.set_keep_alive_max_count(100000);
    http.set_tcp_nodelay(true);
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    http.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake","object":"model","owned_by":"troupe-bench"}]})",
                      "application/json");
    });
    auto completions = [&](bool chat) {
      return [&, chat](const httplib::Request& req, httplib::Response& res) {
        http_request h;
        h.chat = chat;
        if (auto error = parse_openai(req.body, chat, h)) {
          res.status = 400;
          res.set_content(error->dump(), "application/json");
          return;
        }
        bool stream = false;
        try {
          stream = nlohmann::json::parse(req.body).value("stream", false);
        } catch (const nlohmann::json::exception&) {
          res.status = 400;
          res.set_content(openai_error("'stream' must be a boolean", "stream").dump(), "application/json");
          return;
        }
        h.id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(num_http_requests++);
        h.stream = std::make_shared<http_stream>();
        auto channel = h.stream;
        const std::string id = h.id;
        inbox.push(std::move(h));
        if (stream) {
          res.set_chunked_content_provider(
              "text/event-stream",
              [channel](size_t, httplib::DataSink& sink) {
                std::unique_lock lock(channel->mutex);
                if (channel->events.empty() && !channel->finished) {
                  channel->changed.wait_for(lock, std::chrono::seconds(1));
                }
                if (channel->events.empty() && !channel->finished) {
                  lock.unlock();
                  if (!sink.write(": keep-alive\n\n", 14)) channel->gone = true;
                  return !channel->gone;
                }
                std::string out;
                for (auto& e : channel->events) out += e;
                channel->events.clear();
                const bool finished = channel->finished;
                lock.unlock();
                if (!out.empty() && !sink.write(out.data(), out.size())) {
                  channel->gone = true;
                  return false;
                }
                if (finished) sink.done();
                return true;
              },
              [channel](bool success) {
                if (!success) channel->gone = true;
              });
          return;
        }
        // Whole: wait for the end (the engine always ends a request, also when it stops).
        std::unique_lock lock(channel->mutex);
        for (int i = 0; i < 36000 && !channel->finished; ++i) channel->changed.wait_for(lock, std::chrono::milliseconds(100));
        nlohmann::json choice = {{"index", 0}, {"finish_reason", "length"}};
        if (chat) {
          choice["message"] = {{"role", "assistant"}, {"content", channel->text}};
        } else {
          choice["text"] = channel->text;
        }
        nlohmann::json body = {{"id", id},
                               {"object", chat ? "chat.completion" : "text_completion"},
                               {"created", 0},
                               {"model", "fake"},
                               {"choices", nlohmann::json::array({choice})},
                               {"usage", {{"prompt_tokens", channel->prompt_tokens},
                                          {"completion_tokens", channel->completion_tokens},
                                          {"total_tokens", channel->prompt_tokens + channel->completion_tokens}}}};
        res.set_content(body.dump(), "application/json");
      };
    };
    http.Post("/v1/completions", completions(false));
    http.Post("/v1/chat/completions", completions(true));
    // Port 0: any free port, named in the ready line.
    http_port = settings.http_port == 0 ? http.bind_to_any_port(settings.http_host.c_str())
                                        : (http.bind_to_port(settings.http_host.c_str(), settings.http_port) ? settings.http_port : -1);
    if (http_port <= 0) {
      std::fprintf(stderr, "fake server: cannot bind HTTP %s:%d\n", settings.http_host.c_str(), settings.http_port);
      return 1;
    }
    http_runner.thread = std::thread([&] { http.listen_after_bind(); });
  }
  const std::string zmq_bound = socket ? socket->get(zmq::sockopt::last_endpoint) : std::string("off");
  const std::string http_bound = http_port > 0 ? "http://" + settings.http_host + ":" + std::to_string(http_port) : "off";
  std::printf("fake server: ready (zmq %s, http %s; ttft %.1f ms, tpot %.1f ms, %d at once)\n", zmq_bound.c_str(),
              http_bound.c_str(), settings.ttft_ms, settings.tpot_ms, settings.max_concurrency);
  std::fflush(stdout);
  fake_engine engine(settings, socket ? &*socket : nullptr, inbox);
  engine.run(stop);
  return 0;
}

}  // namespace troupe::bench_tool
