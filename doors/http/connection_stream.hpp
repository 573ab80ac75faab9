#pragma once
// One client connection as cpp-httplib reads and writes it. httplib 0.11 makes a new stream
// (with its own read-ahead buffer) for every request on a connection, so bytes of a pipelined
// second request read along with the first were lost and the connection stalled; this stream
// carries them over (`http_connection::pending`). Its reads also keep the request's deadline:
// a body that has not arrived by then gets 408 and the connection is closed.

#include <atomic>
#include <chrono>
#include <string>

#include <httplib.h>

namespace troupe {

using steady_time = std::chrono::steady_clock::time_point;

// A connection between two requests, or while one arrives: it owns its socket.
struct http_connection {
  int fd = -1;
  std::string pending;      // bytes received and not yet read by httplib: the next request's start
  steady_time deadline{};   // the request now arriving must be whole by then
  steady_time queued_at{};  // when it was handed to the workers: a wait for one is not its fault
};

// Closes at once (no response owed). A socket with unread bytes is reset by the kernel.
void close_connection(http_connection& connection);

// Writes a complete error response with `Connection: close` without blocking (best effort: a
// fresh socket's send buffer holds it); returns whether it was written whole.
bool send_final_error(int fd, int status, const std::string& reason, const std::string& json_body);

class connection_stream : public httplib::Stream {
 public:
  connection_stream(http_connection connection, std::chrono::milliseconds write_timeout,
                    const std::atomic<bool>& stopping, const std::string& timeout_body);
  ~connection_stream() override;
  connection_stream(const connection_stream&) = delete;
  connection_stream& operator=(const connection_stream&) = delete;

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return connection_.fd; }

  // The request's deadline passed while it was read: 408 was sent, nothing more may be.
  bool timed_out() const { return timed_out_; }
  // Gives the connection back with the bytes read past this request; the stream is then empty.
  http_connection release();

 private:
  http_connection connection_;
  size_t num_consumed_ = 0;  // of connection_.pending, already handed to httplib
  std::chrono::milliseconds write_timeout_;
  const std::atomic<bool>& stopping_;
  const std::string& timeout_body_;  // the 408's body
  bool timed_out_ = false;
};

}  // namespace troupe
