#pragma once
// A read-only memory mapping of a whole file: weights are used in place, never copied.

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>

namespace troupe {

class mapped_file {
 public:
  // Throws std::runtime_error naming the path when it is missing, unreadable or not a file.
  static std::shared_ptr<const mapped_file> open(const std::filesystem::path& path);

  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file();

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }

  // Drops this process's resident pages wholly inside [begin, begin + bytes) (a range of this
  // mapping) once the loader has copied them elsewhere: a read-only private file mapping gives a
  // dropped page back from the file if anything reads it again, so this only frees memory.
  void release_pages(const std::byte* begin, size_t bytes) const;

 private:
  mapped_file() = default;
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace troupe
