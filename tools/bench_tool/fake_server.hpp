#pragma once
// A test server with known delays, for checking the bench itself: it speaks enough of Troupe's
// ZeroMQ protocol (generate with streamed deltas and the final usage and timings, abort, stats)
// and of OpenAI's HTTP API (streaming and whole /v1/completions and /v1/chat/completions,
// /v1/models, /health) that the bench cannot tell it from a real server, and it generates no
// text: each request, once admitted, sends its first token `ttft_ms` later and each next one
// `tpot_ms` after the previous, on a fixed schedule from its admission (late wake-ups do not add
// up). At most `max_concurrency` requests run at once, from both doors together; the rest wait
// in arrival order. So a request of n output tokens holds a slot for ttft + (n - 1) tpot, and the
// server completes at most max_concurrency / that requests per second: a known capacity.

#include <atomic>
#include <string>

namespace troupe::bench_tool {

struct fake_server_settings {
  std::string zmq_endpoint;  // empty: no ZeroMQ door; a wildcard port (tcp://127.0.0.1:*) is allowed
  std::string http_host = "127.0.0.1";
  int http_port = -1;  // -1: no HTTP door; 0: any free port
  double ttft_ms = 100;
  double tpot_ms = 20;
  int max_concurrency = 4;
};

// Serves until `stop` turns true (checked at least every 200 ms); returns the exit status.
// Prints one line on stdout once both doors listen: "fake server: ready (zmq ENDPOINT, http
// URL; ...)", naming the ports it bound.
int run_fake_server(const fake_server_settings& settings, const std::atomic<bool>& stop);

}  // namespace troupe::bench_tool
