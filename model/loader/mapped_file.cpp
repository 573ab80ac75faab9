#include "model/loader/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
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

void mapped_file::release_pages(const std::byte* begin, size_t bytes) const {
  if (begin < data_ || begin + bytes > data_ + size_) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + bytes) / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

mapped_file::~mapped_file() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace troupe
