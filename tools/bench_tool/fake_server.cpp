#include "tools/bench_tool/fake_server.hpp"

#include <cstdio>
#include <optional>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "tools/bench_tool/fake_engine.hpp"

namespace troupe::bench_tool {

namespace {

nlohmann::json openai_error(const std::string& message, const std::string& param) {
  return {{"error", {{"message", message}, {"type", "invalid_request_error"}, {"param", param}, {"code", nullptr}}}};
}

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
    } else if (p.is_array() && !p.empty() &&
               std::all_of(p.begin(), p.end(), [](const auto& v) { return v.is_number_integer(); })) {
      out.prompt_tokens = static_cast<int>(p.size());
    } else {
      return openai_error("'prompt' must be a string or an array of token ids (one prompt)", "prompt");
    }
  }
  const char* max_field = chat && j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (j.contains(max_field)) {
    if (!j[max_field].is_number_integer() || j[max_field].get<long long>() < 1 ||
        j[max_field].get<long long>() > 1000000) {
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
        for (int i = 0; i < 36000 && !channel->finished; ++i)
          channel->changed.wait_for(lock, std::chrono::milliseconds(100));
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
                               {"usage",
                                {{"prompt_tokens", channel->prompt_tokens},
                                 {"completion_tokens", channel->completion_tokens},
                                 {"total_tokens", channel->prompt_tokens + channel->completion_tokens}}}};
        res.set_content(body.dump(), "application/json");
      };
    };
    http.Post("/v1/completions", completions(false));
    http.Post("/v1/chat/completions", completions(true));
    // Port 0: any free port, named in the ready line.
    http_port = settings.http_port == 0
                    ? http.bind_to_any_port(settings.http_host.c_str())
                    : (http.bind_to_port(settings.http_host.c_str(), settings.http_port) ? settings.http_port : -1);
    if (http_port <= 0) {
      std::fprintf(stderr, "fake server: cannot bind HTTP %s:%d\n", settings.http_host.c_str(), settings.http_port);
      return 1;
    }
    http_runner.thread = std::thread([&] { http.listen_after_bind(); });
  }
  const std::string zmq_bound = socket ? socket->get(zmq::sockopt::last_endpoint) : std::string("off");
  const std::string http_bound =
      http_port > 0 ? "http://" + settings.http_host + ":" + std::to_string(http_port) : "off";
  std::printf("fake server: ready (zmq %s, http %s; ttft %.1f ms, tpot %.1f ms, %d at once)\n", zmq_bound.c_str(),
              http_bound.c_str(), settings.ttft_ms, settings.tpot_ms, settings.max_concurrency);
  std::fflush(stdout);
  fake_engine engine(settings, socket ? &*socket : nullptr, inbox);
  engine.run(stop);
  return 0;
}

}  // namespace troupe::bench_tool
