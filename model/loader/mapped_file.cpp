#include "model/loader/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe {

std::shared_ptr<const mapped_file> mapped_file::open(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw std::runtime_error("cannot open '" + path.string() + "': " + std::strerror(errno));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw std::runtime_error("'" + path.string() + "' is not a regular file");
  }
  std::shared_ptr<mapped_file> file(new mapped_file());
  file->path_ = path;
  file->size_ = static_cast<size_t>(info.st_size);
  if (file->size_ > 0) {
    void* address = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (address == MAP_FAILED) {
      int error = errno;
      ::close(fd);
      throw std::runtime_error("cannot map '" + path.string() + "': " + std::strerror(error));
    }
    file->data_ = static_cast<const std::byte*>(address);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  return file;
}

mapped_file::~mapped_file() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace troupe
