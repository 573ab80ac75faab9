#include "doors/http/connection_workers.hpp"

#include <algorithm>

namespace troupe {

bool is_probe(std::string_view header_block) {
  for (std::string_view path : {"/health", "/metrics"}) {
    const std::string prefix = "GET " + std::string(path);
    if (header_block.substr(0, prefix.size()) != prefix || header_block.size() <= prefix.size()) continue;
    const char next = header_block[prefix.size()];
    if (next == ' ' || next == '?') return true;
  }
  return false;
}

connection_workers::connection_workers(int num_threads, int num_reserved, serve_fn serve) : serve_(std::move(serve)) {
  num_reserved = std::clamp(num_reserved, 0, std::max(0, num_threads - 1));
  for (int i = 0; i < num_threads; ++i)
    threads_.emplace_back([this, probes_only = i < num_reserved] { work(probes_only); });
}

connection_workers::~connection_workers() { stop(); }

void connection_workers::submit(http_connection connection) {
  const bool probe = is_probe(connection.pending);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      close_connection(connection);
      return;
    }
    connection.queued_at = std::chrono::steady_clock::now();
    (probe ? probes_ : others_).push_back(std::move(connection));
  }
  // A probe may be taken by either kind of thread; a reserved one may be the only one free.
  any_waiting_.notify_one();
  if (probe) probe_waiting_.notify_one();
}

void connection_workers::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  any_waiting_.notify_all();
  probe_waiting_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
  for (auto* queue : {&probes_, &others_}) {
    for (auto& c : *queue) close_connection(c);
    queue->clear();
  }
}

void connection_workers::work(bool probes_only) {
  for (;;) {
    http_connection next;
    {
      std::unique_lock lock(mutex_);
      (probes_only ? probe_waiting_ : any_waiting_).wait(lock, [&] {
        return stopping_ || !probes_.empty() || (!probes_only && !others_.empty());
      });
      if (stopping_) return;
      auto& queue = !probes_.empty() ? probes_ : others_;
      next = std::move(queue.front());
      queue.pop_front();
    }
    // The deadline bounds the client's sending, not the server's queue.
    next.deadline += std::chrono::steady_clock::now() - next.queued_at;
    serve_(std::move(next));
  }
}

}  // namespace troupe
