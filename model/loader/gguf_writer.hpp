#pragma once
// Builds a GGUF v3 file: metadata in insertion order, then tensor infos, then aligned data.
// A tensor's bytes are either given up front or produced while the file is written, one tensor
// at a time, so a quantizer never holds the whole model in memory.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
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
  // A tensor of `num_bytes` whose bytes `produce` writes into the buffer it is given when the
  // writer reaches it (in the order tensors were added).
  using tensor_producer = std::function<void(std::byte* out)>;
  void add_tensor(const std::string& name, gguf_tensor_type type, std::vector<int64_t> dims, size_t num_bytes,
                  tensor_producer produce);
  // Removes a key if present.
  void erase(const std::string& key);
  void write(const std::filesystem::path& path) const;

 private:
  struct pending_tensor {
    std::string name;
    gguf_tensor_type type;
    std::vector<int64_t> dims;
    std::vector<std::byte> data;  // empty when `produce` makes the bytes
    size_t num_bytes = 0;
    tensor_producer produce;
  };
  uint64_t alignment() const;
  std::vector<std::pair<std::string, gguf_value>> metadata_;
  std::vector<pending_tensor> tensors_;
};

}  // namespace troupe
