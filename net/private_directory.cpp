#include "net/private_directory.hpp"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace troupe {

private_directory::private_directory(std::string_view prefix) {
  std::filesystem::path base = std::filesystem::temp_directory_path();
  // A Unix socket's path has room for 107 bytes.
  if (base.string().size() > 64) base = "/tmp";
  std::string pattern = (base / (std::string(prefix) + "-XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("cannot make a private directory in " + base.string() + ": " + std::strerror(errno));
  }
  path_ = pattern;
}

private_directory::~private_directory() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace troupe
