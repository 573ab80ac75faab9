#pragma once
// Builds a GGUF v3 file: metadata in insertion order, then tensor infos, then aligned data.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/loader/gguf_types.hpp"

namespace troupe {

class gguf_writer {
 public:
  // Replaces an existing key's value in place.
  void set(const std::string& key, gguf_value value);
  // `dims` innermost first (as GGUF stores them); `data` is copied.
  void add_tensor(const std::string& name, gguf_tensor_type type, std::vector<int64_t> dims,
                  std::vector<std::byte> data);
  void write(const std::filesystem::path& path) const;

 private:
  struct pending_tensor {
    std::string name;
    gguf_tensor_type type;
    std::vector<int64_t> dims;
    std::vector<std::byte> data;
  };
  uint64_t alignment() const;
  std::vector<std::pair<std::string, gguf_value>> metadata_;
  std::vector<pending_tensor> tensors_;
};

}  // namespace troupe
