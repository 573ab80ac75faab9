#pragma once
// A memory-mapped GGUF file (v2/v3): metadata, tensor infos and tensor data, every read
// bounds-checked so a truncated or lying file gives an error naming the file, never a crash.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/loader/gguf_types.hpp"
#include "model/loader/mapped_file.hpp"
#include "model/weight_store.hpp"

namespace troupe {

struct gguf_tensor_info {
  std::string name;
  std::vector<int64_t> dims;  // as GGUF stores them: innermost (contiguous) first
  uint32_t type = 0;          // ggml type id (gguf_tensor_type when Troupe supports it)
  uint64_t offset = 0;        // from the start of the data section
  const std::byte* data = nullptr;
  size_t num_bytes = 0;  // 0 when the type is not one Troupe supports

  // Outermost first, as weight_tensor holds it: GGUF [in, out] is shape [out, in].
  std::vector<int64_t> shape() const { return {dims.rbegin(), dims.rend()}; }
  std::optional<dtype> element_type() const { return dtype_of(type); }
};

class gguf_file {
 public:
  static gguf_file open(const std::filesystem::path& path);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::filesystem::path& path() const { return mapping_->path(); }
  const std::shared_ptr<const mapped_file>& mapping() const { return mapping_; }

  // Keys in file order.
  const std::vector<std::string>& keys() const { return keys_; }
  const gguf_value* find(const std::string& key) const;
  // Typed access; get_* throw naming the file and key when missing or of the wrong kind.
  std::optional<int64_t> find_int(const std::string& key) const;
  std::optional<double> find_float(const std::string& key) const;
  std::optional<std::string> find_string(const std::string& key) const;
  std::optional<bool> find_bool(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  const nlohmann::json& get_array(const std::string& key) const;

  const std::vector<gguf_tensor_info>& tensors() const { return tensors_; }
  const gguf_tensor_info* find_tensor(const std::string& name) const;
  // A view of the tensor's mapped data with canonical (outermost-first) shape, named `name`.
  // Throws for ggml types other than F32/F16/BF16/Q8_0.
  weight_tensor view(const gguf_tensor_info& info, const std::string& name) const;

 private:
  std::shared_ptr<const mapped_file> mapping_;
  uint32_t version_ = 0;
  uint64_t alignment_ = gguf_default_alignment;
  std::vector<std::string> keys_;
  std::map<std::string, gguf_value> metadata_;
  std::vector<gguf_tensor_info> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace troupe
