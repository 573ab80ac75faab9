#pragma once
// One memory-mapped .safetensors file with its header parsed and checked: every tensor's bytes
// lie inside the data area, match shape × dtype size, and no two tensors overlap.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/loader/mapped_file.hpp"
#include "model/weight_store.hpp"

namespace troupe {

class safetensors_file {
 public:
  // Throws std::runtime_error naming the file and the problem (missing, truncated, bad header,
  // "unsupported dtype X in tensor Y of file Z", out-of-bounds or overlapping data).
  static safetensors_file open(const std::filesystem::path& path);

  // Tensors in file order (sorted by data offset); `data` points into the mapping.
  const std::vector<weight_tensor>& tensors() const { return tensors_; }
  const std::shared_ptr<const mapped_file>& mapping() const { return mapping_; }
  const std::filesystem::path& path() const { return mapping_->path(); }

  // Adds every tensor to `store` and keeps the mapping alive there.
  void add_to(weight_store& store) const;

 private:
  std::shared_ptr<const mapped_file> mapping_;
  std::vector<weight_tensor> tensors_;
};

// Loads model.safetensors, or every shard named by model.safetensors.index.json's weight_map,
// from an HF directory into `store`. Throws naming the missing shard or index problem.
void load_safetensors_directory(const std::filesystem::path& directory, weight_store& store);

}  // namespace troupe
