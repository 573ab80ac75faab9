// The ZeroMQ session: one troupe::client (one DEALER socket) per thread.
#include <exception>

#include "client/client.hpp"
#include "tools/bench_tool/server_client.hpp"

namespace troupe::bench_tool {

namespace {

double seconds_since(bench_clock::time_point from, bench_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

class zmq_session : public server_session {
 public:
  zmq_session(const std::string& endpoint, const std::string& api_key, const request_settings& settings)
      : client_(endpoint, api_key), settings_(settings) {
    client_.set_timeout(std::chrono::duration_cast<std::chrono::milliseconds>(settings.timeout));
  }

  request_record send(const bench_request& request, bench_clock::time_point run_start) override {
    generate_request r;
    if (!request.prompt_ids.empty()) {
      r.prompt_token_ids = request.prompt_ids;
    } else {
      r.prompt = request.prompt_text;
    }
    r.sampling.max_tokens = request.output_len;
    r.sampling.temperature = static_cast<float>(settings_.temperature);
    r.sampling.ignore_eos = settings_.ignore_eos;
    r.sampling.num_speculative_tokens = settings_.num_speculative_tokens;
    r.id = client_.next_id();
    request_record record;
    record.prompt_tokens = request.prompt_len;
    const auto sent = bench_clock::now();
    record.start = seconds_since(run_start, sent);
    bench_clock::time_point last{};
    int num_streamed = 0;
    try {
      completion c = client_.generate(r, [&](const delta_reply& delta) {
        if (delta.token_ids.empty()) return;
        const auto now = bench_clock::now();
        if (num_streamed == 0) {
          record.ttft = seconds_since(sent, now);
        } else {
          record.itl.push_back(seconds_since(last, now));
        }
        last = now;
        num_streamed += static_cast<int>(delta.token_ids.size());
      });
      record.e2e = seconds_since(sent, bench_clock::now());
      if (num_streamed == 0) record.ttft = record.e2e;
      record.output_tokens = c.usage.completion_tokens > 0 ? c.usage.completion_tokens : num_streamed;
      if (c.usage.prompt_tokens > 0) record.prompt_tokens = c.usage.prompt_tokens;
      if (const auto& s = c.usage.speculative) {
        record.speculative = true;
        record.draft_tokens = s->draft_tokens;
        record.accepted_tokens = s->accepted_tokens;
        record.tokens_per_step = s->tokens_per_step;
      }
      record.ok = true;
    } catch (const std::exception& e) {
      record.error = e.what();
      // A request the server still runs after a timeout must not hold its KV blocks on.
      try {
        client_.abort(r.id);
      } catch (const std::exception&) {
      }
    }
    return record;
  }

 private:
  client client_;
  request_settings settings_;
};

class zmq_server_client : public server_client {
 public:
  zmq_server_client(std::string endpoint, std::string api_key, const request_settings& settings)
      : endpoint_(std::move(endpoint)), api_key_(std::move(api_key)), settings_(settings) {}
  std::unique_ptr<server_session> open_session() override {
    return std::make_unique<zmq_session>(endpoint_, api_key_, settings_);
  }
  bool answers() override {
    try {
      client c(endpoint_, api_key_);
      c.set_timeout(std::chrono::milliseconds(500));
      c.stats();
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }
  prompt_form form() const override { return prompt_form::token_ids; }

 private:
  std::string endpoint_;
  std::string api_key_;
  request_settings settings_;
};

}  // namespace

std::unique_ptr<server_client> make_zmq_client(const std::string& endpoint, const std::string& api_key,
                                               const request_settings& settings) {
  if (endpoint.rfind("tcp://", 0) != 0 && endpoint.rfind("ipc://", 0) != 0) {
    throw std::invalid_argument("--endpoint '" + endpoint + "' is not a ZeroMQ address such as tcp://127.0.0.1:5557");
  }
  return std::make_unique<zmq_server_client>(endpoint, api_key, settings);
}

}  // namespace troupe::bench_tool
