#include "net/bounded_accept.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

namespace troupe {

namespace {

std::mutex spare_mutex;
int spare = -1;  // guarded by spare_mutex

void open_spare_locked() {
  if (spare < 0) spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

}  // namespace

void reserve_spare_descriptor() {
  std::lock_guard lock(spare_mutex);
  open_spare_locked();
}

int accept_connection(int listener, std::string& shed) {
  shed.clear();
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) return fd;
    if (errno == EINTR) continue;
    if (errno != EMFILE && errno != ENFILE) return -1;  // EAGAIN, or a peer gone before accept: nothing to do
    std::lock_guard lock(spare_mutex);
    if (spare < 0) {
      // No reserve (never opened, or another thread's shed took it and the process is still
      // full): nothing can drain the queue now; the caller's poll must not spin on it.
      shed = "the process is out of file descriptors and has none in reserve";
      return -1;
    }
    ::close(spare);
    spare = -1;
    const int doomed = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (doomed >= 0) ::close(doomed);
    open_spare_locked();
    shed = errno == ENFILE ? "the system is out of file descriptors" : "the process is at its open-files limit";
    return -1;
  }
  return -1;
}

}  // namespace troupe
