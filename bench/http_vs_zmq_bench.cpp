// The HTTP door against the ZeroMQ door of one running `troupe serve`, side by side in one run:
// the latency of one request at a time (the door's added cost: parsing, routing, the transport),
// the time to the first streamed text (SSE against ZeroMQ deltas) and the requests/s of N
// concurrent clients, for the same greedy request.
//
//   troupe serve --model ../shared/models/stories260K/hf --port 5557 --http-port 8000
//       --served-model-name stories260K --threads 1     (one command line)
//   troupe_bench_http --zmq tcp://127.0.0.1:5557 --http 127.0.0.1:8000 --model stories260K
//
// Rounds alternate ZeroMQ and HTTP so that load from elsewhere hits both alike; the best round
// of each is reported.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "client/client.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

struct settings {
  std::string zmq = "tcp://127.0.0.1:5557";
  std::string http_host = "127.0.0.1";
  int http_port = 8000;
  std::string model = "stories260K";
  std::string api_key;
  std::string prompt = "Once upon a time";
  int max_tokens = 1;
  int latency_requests = 200;
  int concurrency = 16;
  int throughput_requests = 800;
  int rounds = 3;
};

// One path's way of sending a request and waiting for its whole completion; one per thread.
class door_client {
 public:
  virtual ~door_client() = default;
  virtual void complete() = 0;
  // Streams the same request; returns the milliseconds until the first text arrived.
  virtual double first_text_ms() = 0;
};

class zmq_door : public door_client {
 public:
  explicit zmq_door(const settings& s) : client_(s.zmq, s.api_key) {
    request_.prompt = s.prompt;
    request_.sampling.temperature = 0.0f;
    request_.sampling.max_tokens = s.max_tokens;
    request_.stream = false;
  }
  void complete() override {
    auto r = request_;
    r.id.clear();
    if (client_.generate(std::move(r)).text.empty() && request_.sampling.max_tokens > 4) std::abort();
  }
  double first_text_ms() override {
    auto r = request_;
    r.id.clear();
    r.stream = true;
    const auto begin = clock_type::now();
    double first = -1;
    client_.generate(std::move(r), [&](const troupe::delta_reply& d) {
      if (first < 0 && !d.text.empty())
        first = std::chrono::duration<double, std::milli>(clock_type::now() - begin).count();
    });
    return first;
  }

 private:
  troupe::client client_;
  troupe::generate_request request_;
};

class http_door : public door_client {
 public:
  explicit http_door(const settings& s) : client_(s.http_host, s.http_port) {
    client_.set_keep_alive(true);
    client_.set_tcp_nodelay(true);  // else Nagle holds the body back behind the headers (40 ms delayed ACK)
    client_.set_read_timeout(120, 0);
    if (!s.api_key.empty()) client_.set_bearer_token_auth(s.api_key);
    body_ = nlohmann::json{{"model", s.model}, {"prompt", s.prompt}, {"max_tokens", s.max_tokens}, {"temperature", 0}}
                .dump();
    stream_body_ = nlohmann::json{
        {"model", s.model},
        {"prompt", s.prompt},
        {"max_tokens", s.max_tokens},
        {"temperature", 0},
        {"stream",
         true}}.dump();
  }
  double first_text_ms() override {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = stream_body_;
    req.set_header("Content-Type", "application/json");
    const auto begin = clock_type::now();
    double first = -1;
    req.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
      // The first event whose text is not empty.
      if (first < 0 && std::string_view(data, length).find("\"text\":\"\"") == std::string_view::npos) {
        first = std::chrono::duration<double, std::milli>(clock_type::now() - begin).count();
      }
      return true;
    };
    auto res = client_.send(req);
    if (!res || res->status != 200) std::exit(1);
    return first;
  }
  void complete() override {
    auto res = client_.Post("/v1/completions", body_, "application/json");
    if (!res || res->status != 200) {
      std::fprintf(stderr, "http request failed: %s\n",
                   res ? res->body.c_str() : httplib::to_string(res.error()).c_str());
      std::exit(1);
    }
    auto reply = nlohmann::json::parse(res->body);
    if (reply["choices"].empty()) std::abort();
  }

 private:
  httplib::Client client_;
  std::string body_, stream_body_;
};

template <class Door>
double mean_latency_ms(const settings& s, std::vector<double>& all) {
  Door door(s);
  door.complete();  // connection set up outside the timing
  std::vector<double> ms;
  for (int i = 0; i < s.latency_requests; ++i) {
    const auto begin = clock_type::now();
    door.complete();
    ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - begin).count());
  }
  all.insert(all.end(), ms.begin(), ms.end());
  double sum = 0;
  for (double v : ms) sum += v;
  return sum / ms.size();
}

template <class Door>
double mean_first_text_ms(const settings& s) {
  Door door(s);
  door.complete();
  double sum = 0;
  for (int i = 0; i < s.latency_requests; ++i) sum += door.first_text_ms();
  return sum / s.latency_requests;
}

template <class Door>
double requests_per_second(const settings& s) {
  std::vector<std::unique_ptr<Door>> doors;
  for (int c = 0; c < s.concurrency; ++c) {
    doors.push_back(std::make_unique<Door>(s));
    doors.back()->complete();
  }
  std::atomic<int> next{0};
  const auto begin = clock_type::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < s.concurrency; ++c) {
    threads.emplace_back([&, c] {
      while (next.fetch_add(1) < s.throughput_requests) doors[static_cast<size_t>(c)]->complete();
    });
  }
  for (auto& t : threads) t.join();
  return s.throughput_requests / std::chrono::duration<double>(clock_type::now() - begin).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--zmq")
      s.zmq = value;
    else if (flag == "--http") {
      const auto colon = value.rfind(':');
      s.http_host = value.substr(0, colon);
      s.http_port = std::stoi(value.substr(colon + 1));
    } else if (flag == "--model")
      s.model = value;
    else if (flag == "--api-key")
      s.api_key = value;
    else if (flag == "--prompt")
      s.prompt = value;
    else if (flag == "--max-tokens")
      s.max_tokens = std::stoi(value);
    else if (flag == "--latency-requests")
      s.latency_requests = std::stoi(value);
    else if (flag == "--concurrency")
      s.concurrency = std::stoi(value);
    else if (flag == "--throughput-requests")
      s.throughput_requests = std::stoi(value);
    else if (flag == "--rounds")
      s.rounds = std::stoi(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::printf("prompt \"%s\", max_tokens %d, %d rounds (best of each)\n", s.prompt.c_str(), s.max_tokens, s.rounds);
  double best_zmq_latency = 1e30, best_http_latency = 1e30, best_zmq_rps = 0, best_http_rps = 0;
  double best_zmq_first = 1e30, best_http_first = 1e30;
  std::vector<double> zmq_all, http_all;
  for (int round = 0; round < s.rounds; ++round) {
    best_zmq_latency = std::min(best_zmq_latency, mean_latency_ms<zmq_door>(s, zmq_all));
    best_http_latency = std::min(best_http_latency, mean_latency_ms<http_door>(s, http_all));
    best_zmq_first = std::min(best_zmq_first, mean_first_text_ms<zmq_door>(s));
    best_http_first = std::min(best_http_first, mean_first_text_ms<http_door>(s));
    best_zmq_rps = std::max(best_zmq_rps, requests_per_second<zmq_door>(s));
    best_http_rps = std::max(best_http_rps, requests_per_second<http_door>(s));
  }
  std::printf("| metric | ZeroMQ | HTTP | HTTP vs ZeroMQ |\n|---|---|---|---|\n");
  std::printf("| mean latency, 1 client (ms) | %.3f | %.3f | %+.3f ms (%.2fx) |\n", best_zmq_latency, best_http_latency,
              best_http_latency - best_zmq_latency, best_http_latency / best_zmq_latency);
  std::printf("| median latency, 1 client, all rounds (ms) | %.3f | %.3f | %+.3f ms |\n", median(zmq_all),
              median(http_all), median(http_all) - median(zmq_all));
  std::printf("| mean time to first text, streamed, 1 client (ms) | %.3f | %.3f | %+.3f ms |\n", best_zmq_first,
              best_http_first, best_http_first - best_zmq_first);
  std::printf("| requests/s, %d clients | %.0f | %.0f | %.2fx |\n", s.concurrency, best_zmq_rps, best_http_rps,
              best_http_rps / best_zmq_rps);
  return 0;
}
