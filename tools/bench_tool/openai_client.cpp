// The OpenAI session: streaming /v1/completions or /v1/chat/completions over one keep-alive
// connection per thread, timed per server-sent event.
#include <mutex>
#include <regex>
#include <stdexcept>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tools/bench_tool/server_client.hpp"

namespace troupe::bench_tool {

namespace {

double seconds_since(bench_clock::time_point from, bench_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

struct http_target {
  std::string scheme_host_port;  // http://127.0.0.1:8000
  std::string prefix;            // a path before /v1, usually empty
};

http_target parse_base_url(const std::string& url) {
  static const std::regex pattern(R"(^(http://[^/]+)(/.*)?$)");
  std::smatch m;
  if (!std::regex_match(url, m, pattern)) {
    throw std::invalid_argument("--base-url '" + url + "' is not http://host:port[/path] (https is not supported)");
  }
  http_target t{m[1], m[2]};
  while (!t.prefix.empty() && t.prefix.back() == '/') t.prefix.pop_back();
  if (t.prefix.size() >= 3 && t.prefix.compare(t.prefix.size() - 3, 3, "/v1") == 0)
    t.prefix.resize(t.prefix.size() - 3);
  return t;
}

std::unique_ptr<httplib::Client> make_http(const http_target& target, const std::string& api_key,
                                           std::chrono::seconds timeout) {
  auto c = std::make_unique<httplib::Client>(target.scheme_host_port);
  c->set_keep_alive(true);
  c->set_tcp_nodelay(true);  // else Nagle holds the body back behind the headers
  c->set_connection_timeout(10, 0);
  c->set_read_timeout(static_cast<time_t>(timeout.count()), 0);
  if (!api_key.empty()) c->set_bearer_token_auth(api_key);
  return c;
}

// The message of an OpenAI error body, or the body itself.
std::string error_text(int status, const std::string& body) {
  std::string message = body.substr(0, 300);
  try {
    auto j = nlohmann::json::parse(body);
    if (j.contains("error") && j["error"].is_object() && j["error"].contains("message")) {
      message = j["error"]["message"].dump();
    }
  } catch (const nlohmann::json::exception&) {
  }
  return "HTTP " + std::to_string(status) + ": " + message;
}

class openai_session : public server_session {
 public:
  openai_session(const http_target& target, const std::string& api_key, std::string model, bool chat,
                 const request_settings& settings)
      : http_(make_http(target, api_key, settings.timeout)),
        path_(target.prefix + (chat ? "/v1/chat/completions" : "/v1/completions")),
        model_(std::move(model)),
        chat_(chat),
        settings_(settings) {}

  request_record send(const bench_request& request, bench_clock::time_point run_start) override {
    nlohmann::json body = {{"model", model_},
                           {"max_tokens", request.output_len},
                           {"temperature", settings_.temperature},
                           {"stream", true},
                           {"stream_options", {{"include_usage", true}}}};
    if (settings_.ignore_eos) body["ignore_eos"] = true;
    if (settings_.num_speculative_tokens >= 0) body["num_speculative_tokens"] = settings_.num_speculative_tokens;
    if (chat_) {
      body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", request.prompt_text}}});
    } else if (!request.prompt_ids.empty()) {
      body["prompt"] = request.prompt_ids;
    } else {
      body["prompt"] = request.prompt_text;
    }
    httplib::Request req;
    req.method = "POST";
    req.path = path_;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.set_header("Accept", "text/event-stream");

    request_record record;
    record.prompt_tokens = request.prompt_len;
    const auto sent = bench_clock::now();
    record.start = seconds_since(run_start, sent);
    bench_clock::time_point last{};
    int num_chunks = 0;
    int usage_output = -1;
    std::string pending;   // bytes of an event not yet complete
    std::string raw_head;  // the start of a body that was not a stream, for the error message
    std::string stream_error;
    bool done = false;
    req.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
      const auto now = bench_clock::now();
      if (raw_head.size() < 2048) raw_head.append(data, std::min<size_t>(length, 2048));
      pending.append(data, length);
      size_t end = 0;
      while ((end = pending.find('\n')) != std::string::npos) {
        std::string line = pending.substr(0, end);
        pending.erase(0, end + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.rfind("data:", 0) != 0) continue;  // blank lines, comments (": keep-alive")
        std::string payload = line.substr(5);
        if (!payload.empty() && payload.front() == ' ') payload.erase(0, 1);
        if (payload == "[DONE]") {
          done = true;
          continue;
        }
        nlohmann::json chunk;
        try {
          chunk = nlohmann::json::parse(payload);
        } catch (const nlohmann::json::exception&) {
          stream_error = "an event that is not JSON: " + payload.substr(0, 200);
          return false;
        }
        if (chunk.contains("error")) {
          stream_error = "error in the stream: " + chunk["error"].dump().substr(0, 300);
          return false;
        }
        if (chunk.contains("usage") && chunk["usage"].is_object()) {
          usage_output = chunk["usage"].value("completion_tokens", -1);
          const int prompt = chunk["usage"].value("prompt_tokens", -1);
          if (prompt > 0) record.prompt_tokens = prompt;
          // Troupe's extension: present when the server verified draft tokens for the request.
          if (const auto s = chunk["usage"].find("speculative"); s != chunk["usage"].end() && s->is_object()) {
            record.speculative = true;
            record.draft_tokens = s->value("draft_tokens", 0);
            record.accepted_tokens = s->value("accepted_tokens", 0);
            record.tokens_per_step = s->value("tokens_per_step", 0.0);
          }
        }
        if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) continue;
        const auto& choice = chunk["choices"][0];
        std::string text;
        if (chat_) {
          if (choice.contains("delta") && choice["delta"].contains("content") &&
              choice["delta"]["content"].is_string()) {
            text = choice["delta"]["content"];
          }
        } else if (choice.contains("text") && choice["text"].is_string()) {
          text = choice["text"];
        }
        if (text.empty()) continue;
        if (num_chunks == 0) {
          record.ttft = seconds_since(sent, now);
        } else {
          record.itl.push_back(seconds_since(last, now));
        }
        last = now;
        ++num_chunks;
      }
      return true;
    };
    auto result = http_->send(req);
    record.e2e = seconds_since(sent, bench_clock::now());
    if (!stream_error.empty()) {
      record.error = stream_error;
    } else if (!result) {
      record.error = "HTTP request failed: " + httplib::to_string(result.error());
    } else if (result->status != 200) {
      record.error = error_text(result->status, result->body.empty() ? raw_head : result->body);
    } else if (!done) {
      record.error = "the stream ended without data: [DONE]";
    } else if (num_chunks == 0) {
      record.error = "the stream carried no output";
    } else {
      record.ok = true;
      // The server's count when it sends one (stream_options.include_usage); else one token per
      // event, which is what most servers stream.
      record.output_tokens = usage_output > 0 ? usage_output : num_chunks;
    }
    return record;
  }

 private:
  std::unique_ptr<httplib::Client> http_;
  std::string path_;
  std::string model_;
  bool chat_;
  request_settings settings_;
};

class openai_server_client : public server_client {
 public:
  openai_server_client(http_target target, std::string api_key, std::string model, bool chat,
                       const request_settings& settings)
      : target_(std::move(target)),
        api_key_(std::move(api_key)),
        model_(std::move(model)),
        chat_(chat),
        settings_(settings) {}

  std::unique_ptr<server_session> open_session() override {
    std::string model;
    {
      std::lock_guard lock(mutex_);  // sessions are opened by many workers at once
      if (model_.empty()) model_ = first_model();
      model = model_;
    }
    return std::make_unique<openai_session>(target_, api_key_, model, chat_, settings_);
  }
  bool answers() override {
    auto http = make_http(target_, api_key_, std::chrono::seconds(2));
    auto res = http->Get(target_.prefix + "/v1/models");
    return res && res->status == 200;
  }
  prompt_form form() const override { return prompt_form::text; }

 private:
  std::string first_model() {
    auto http = make_http(target_, api_key_, std::chrono::seconds(10));
    auto res = http->Get(target_.prefix + "/v1/models");
    if (!res) throw std::runtime_error("GET /v1/models failed (" + httplib::to_string(res.error()) + "); give --model");
    if (res->status != 200)
      throw std::runtime_error("GET /v1/models: " + error_text(res->status, res->body) + "; give --model");
    try {
      return nlohmann::json::parse(res->body).at("data").at(0).at("id").get<std::string>();
    } catch (const nlohmann::json::exception&) {
      throw std::runtime_error("GET /v1/models named no model; give --model");
    }
  }

  http_target target_;
  std::string api_key_;
  std::mutex mutex_;
  std::string model_;  // guarded by mutex_
  bool chat_;
  request_settings settings_;
};

}  // namespace

std::unique_ptr<server_client> make_openai_client(const std::string& base_url, const std::string& api_key,
                                                  std::string model, bool chat, const request_settings& settings) {
  return std::make_unique<openai_server_client>(parse_base_url(base_url), api_key, std::move(model), chat, settings);
}

}  // namespace troupe::bench_tool
