#pragma once
// The fake server's engine: one thread that owns the ZeroMQ socket, takes HTTP requests from an
// inbox, admits at most max_concurrency requests in arrival order, and sends each admitted
// request's tokens on a fixed schedule (first after ttft, then one per tpot, from admission).

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "protocol/replies.hpp"
#include "tools/bench_tool/fake_server.hpp"

namespace troupe::bench_tool {

using fake_clock = std::chrono::steady_clock;

// Whitespace-separated words, at least 1: the fake server's stand-in for a token count.
int count_words(const std::string& text);

// What the engine thread hands an HTTP handler: server-sent events, then the end.
struct http_stream {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::string> events;  // each a whole "data: ...\n\n"
  std::string text;                // all output, for a request that does not stream
  int prompt_tokens = 0;
  int completion_tokens = 0;
  bool finished = false;
  std::atomic<bool> gone{false};  // the client went away: the engine frees its slot
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

// Serves until `stop`; socket may be null (no ZeroMQ door).
class fake_engine {
 public:
  fake_engine(const fake_server_settings& settings, zmq::socket_t* socket, engine_inbox& inbox);
  void run(const std::atomic<bool>& stop);

 private:
  void accept_http(http_request h);
  void receive_zmq();
  void handle_zmq(const std::string& routing_id, bool delimiter, std::string_view frame);
  void reply(const std::string& routing_id, bool delimiter, const server_reply& r);
  void admit();
  void emit_due();
  void send_zmq_token(const fake_request& r, bool last, fake_clock::time_point now);
  void send_http_token(fake_request& r, bool last);
  void finish_stream(fake_request& r, std::string event);

  const fake_server_settings& settings_;
  zmq::socket_t* socket_;
  engine_inbox& inbox_;
  fake_clock::duration ttft_, tpot_;
  std::deque<fake_request> waiting_;
  std::deque<fake_request> running_;
};

}  // namespace troupe::bench_tool
