#pragma once
// Where HTTP connections wait for a request's header block, on one epoll thread, before any
// worker thread is given to them. cpp-httplib 0.11 gives each connection a pool thread at
// accept() and bounds only each read's wait, so clients sending a request a byte a second
// held every thread and /health went unanswered; and it grows a header line without bound
// before it looks at its length. Here a connection holds a thread only once its request line
// and headers are all in, which must happen within `request_timeout` (else 408) and within
// `max_header_bytes` (else 431); both close the connection. The bytes are handed on unparsed:
// httplib still parses them.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "doors/http/connection_stream.hpp"

namespace troupe {

struct reception_options {
  size_t max_header_bytes = 64u << 10;
  std::chrono::milliseconds request_timeout{5000};
  std::chrono::milliseconds idle_timeout{5000};  // a kept-alive connection's wait for its next request
  size_t max_connections = 4096;                 // waiting at once; past it, the one waiting longest is closed
  size_t max_body_bytes = 0;                     // a larger Content-Length gets 413 at once; 0: not checked here
};

// Where the header block in `bytes` ends (one past its blank line), or npos while it has not.
// httplib skips header lines ending in a bare LF, so only an empty CRLF line ends it.
size_t header_block_end(std::string_view bytes, size_t searched_from = 0);

class request_reception {
 public:
  // Called on the reception thread with a connection whose `pending` holds a whole header block.
  using ready_fn = std::function<void(http_connection)>;

  request_reception(reception_options options, ready_fn on_ready);
  ~request_reception();
  request_reception(const request_reception&) = delete;
  request_reception& operator=(const request_reception&) = delete;

  void start();
  // Closes every waiting connection; connections added afterwards are closed at once.
  void stop();

  // Thread-safe. A connection just accepted.
  void add_new(int fd);
  // Thread-safe. A connection whose response is written, kept for its next request (which
  // `pending` may already hold, pipelined).
  void add_kept(http_connection connection);
  // Thread-safe. A connection that was sent a final error: what it still sends is read and
  // dropped for a moment, so that the error reaches it before the socket closes.
  void add_closing(http_connection connection);

  const reception_options& options() const { return options_; }
  // Thread-safe: connections answered 408, 413 or 431 here (httplib never sees them).
  uint64_t num_refused() const { return num_refused_; }

 private:
  enum class phase { idle, receiving, closing };
  struct waiting {
    http_connection connection;
    phase state = phase::receiving;
    size_t num_searched = 0;  // of pending, searched for the header block's end
    steady_time since{};
  };

  void hand_over(waiting w);
  void run();
  void take_incoming();
  void admit(waiting w);
  void on_readable(int fd);
  void expire(steady_time now);
  // Refuses (413) a request whose Content-Length exceeds max_body_bytes; whether it did.
  bool refuse_oversized_body(waiting& w, size_t header_end);
  void refuse(waiting& w, int status, const std::string& reason, const std::string& body);
  void drop(int fd);

  reception_options options_;
  ready_fn on_ready_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<waiting> incoming_;             // guarded by mutex_
  bool stopped_ = false;                      // guarded by mutex_
  std::unordered_map<int, waiting> waiting_;  // reception thread only
  // waiting_'s size as of the reception thread's last pass, for hand_over's bound on the accept
  // thread (a pass late at most: the reception drops the oldest waiting past the bound itself).
  std::atomic<size_t> num_waiting_{0};
  std::atomic<uint64_t> num_refused_{0};
};

}  // namespace troupe
