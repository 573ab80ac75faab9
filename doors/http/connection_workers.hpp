#pragma once
// The threads that serve HTTP connections whose request's headers have arrived
// (request_reception): each runs one request, its body read and its response written, then
// hands the connection back. A few of them take only probes (GET /health, GET /metrics), so
// that clients holding every other thread (open streams, bodies sent slowly) never starve them.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "doors/http/connection_stream.hpp"

namespace troupe {

// Whether a header block is a GET of /health or /metrics, the requests load balancers and
// scrapers send and that must be answered whatever else the server is doing.
bool is_probe(std::string_view header_block);

class connection_workers {
 public:
  using serve_fn = std::function<void(http_connection)>;

  // num_threads in all, num_reserved of them for probes only.
  connection_workers(int num_threads, int num_reserved, serve_fn serve);
  ~connection_workers();
  connection_workers(const connection_workers&) = delete;
  connection_workers& operator=(const connection_workers&) = delete;

  // Thread-safe; closes the connection once stopped.
  void submit(http_connection connection);
  // Waits for the requests being served; closes those not started.
  void stop();

 private:
  void work(bool probes_only);

  serve_fn serve_;
  std::mutex mutex_;
  std::condition_variable any_waiting_;    // for the threads that take anything
  std::condition_variable probe_waiting_;  // for the reserved ones
  std::deque<http_connection> probes_;     // guarded by mutex_
  std::deque<http_connection> others_;     // guarded by mutex_
  bool stopping_ = false;                  // guarded by mutex_
  std::vector<std::thread> threads_;
};

}  // namespace troupe
