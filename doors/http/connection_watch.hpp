#pragma once
// Whether the client of an HTTP request is still connected, for the waits during which nothing
// is written to it (a non-streaming request, or a stream before its first token). cpp-httplib
// 0.11 hands a handler no socket, so the request's connection is found among the process's
// descriptors by its two ends: the server's port and the client's address and port. While the
// handler runs, httplib keeps that socket open, so the descriptor cannot be reused under us.

#include <string>

namespace troupe {

class connection_watch {
 public:
  connection_watch() = default;
  // Scans /proc/self/fd once; a watch that found nothing reports the client as present.
  static connection_watch find(const std::string& remote_addr, int remote_port, int local_port);

  bool found() const { return fd_ >= 0; }
  // The peer closed or reset the connection. Never blocks.
  bool client_gone() const;

 private:
  explicit connection_watch(int fd) : fd_(fd) {}
  int fd_ = -1;  // not owned
};

}  // namespace troupe
