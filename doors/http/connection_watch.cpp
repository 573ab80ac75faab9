#include "doors/http/connection_watch.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

#include "doors/http/socket_address.hpp"

namespace troupe {

connection_watch connection_watch::find(const std::string& remote_addr, int remote_port, int local_port) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return {};
  int found = -1;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    struct stat info;
    if (::fstat(static_cast<int>(fd), &info) != 0 || !S_ISSOCK(info.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_size = sizeof local, peer_size = sizeof peer;
    std::string host;
    int port = 0;
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_size) != 0 ||
        !describe_address(local, host, port) || port != local_port) {
      continue;
    }
    if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0 ||
        !describe_address(peer, host, port) || port != remote_port || host != remote_addr) {
      continue;
    }
    found = static_cast<int>(fd);
    break;
  }
  ::closedir(dir);
  return connection_watch(found);
}

bool connection_watch::client_gone() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace troupe
