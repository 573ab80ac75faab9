#pragma once
// One memory-mapped .safetensors file with its header parsed and checked: every tensor's bytes
// lie inside the data area, match shape × dtype size, and no two tensors overlap.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/loader/mapped_file.hpp"
#include "model/weight_store.hpp"

namespace troupe {

// One tensor as the file stores it. The float types are weights (as_weight); the integer ones
// (I32 qweight/qzeros/g_idx, I64 weight_shape...) only carry a quantized checkpoint's packed
// weights and metadata, which model/loader/quantized_checkpoint.hpp turns into weights.
struct safetensors_tensor {
  std::string name;
  std::string type_name;       // the header's dtype: "F32", "BF16", "F8_E4M3", "I32", ...
  std::vector<int64_t> shape;  // outermost first
  const std::byte* data = nullptr;
  size_t num_bytes = 0;
  std::filesystem::path file;  // for messages

  int64_t num_elements() const;
  bool is_integer() const { return !weight_type(); }
  // Element i (row-major) of an integer tensor (I64, I32, I16, I8 sign-extended; U8).
  int64_t integer_at(int64_t i) const;
  // Element i of a float tensor (F32, F16, BF16, F8_E4M3).
  float float_at(int64_t i) const;
  // The weight type of a float tensor (F32, F16, BF16, F8_E4M3), none for integer ones.
  std::optional<dtype> weight_type() const;
  // Throws "unsupported dtype I32 in tensor X of file Y (...)" for an integer tensor.
  weight_tensor as_weight() const;
};

// Bytes per element of a safetensors dtype name Troupe reads, none for any other name.
std::optional<size_t> safetensors_element_bytes(std::string_view type_name);
// The safetensors dtype name of a weight type (throws for a type safetensors cannot hold).
const char* safetensors_dtype_name(dtype type);

class safetensors_file {
 public:
  // Throws std::runtime_error naming the file and the problem (missing, truncated, bad header,
  // "unsupported dtype X in tensor Y of file Z", out-of-bounds or overlapping data).
  static safetensors_file open(const std::filesystem::path& path);

  // Tensors in file order (sorted by data offset); `data` points into the mapping.
  const std::vector<safetensors_tensor>& tensors() const { return tensors_; }
  const std::shared_ptr<const mapped_file>& mapping() const { return mapping_; }
  const std::filesystem::path& path() const { return mapping_->path(); }

  // Adds every tensor to `store` as a weight and keeps the mapping alive there.
  void add_to(weight_store& store) const;

 private:
  std::shared_ptr<const mapped_file> mapping_;
  std::vector<safetensors_tensor> tensors_;
};

// Every tensor of an HF directory: model.safetensors, or every shard named by
// model.safetensors.index.json's weight_map. `mappings` keep the tensors' bytes alive.
struct safetensors_checkpoint {
  std::vector<safetensors_tensor> tensors;
  std::vector<std::shared_ptr<const mapped_file>> mappings;

  const safetensors_tensor* find(const std::string& name) const;
};
// Throws naming the missing shard or index problem.
safetensors_checkpoint read_safetensors_directory(const std::filesystem::path& directory);

// Loads every tensor of an HF directory into `store` as a weight (a plain, unquantized checkpoint).
void load_safetensors_directory(const std::filesystem::path& directory, weight_store& store);

}  // namespace troupe
