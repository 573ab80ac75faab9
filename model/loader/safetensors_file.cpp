#include "model/loader/safetensors_file.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "model/loader/hf_config.hpp"

namespace troupe {
namespace {

// A header bigger than this is not a safetensors header (the format's own limit is 100 MB).
constexpr uint64_t max_header_bytes = 100'000'000;

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& problem) {
  throw std::runtime_error("safetensors file '" + path.string() + "': " + problem);
}

bool parse_dtype(const std::string& name, dtype& type) {
  if (name == "F32") type = dtype::f32;
  else if (name == "F16") type = dtype::f16;
  else if (name == "BF16") type = dtype::bf16;
  else return false;
  return true;
}

}  // namespace

safetensors_file safetensors_file::open(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) fail(path, "file does not exist");
  safetensors_file file;
  file.mapping_ = mapped_file::open(path);
  const std::byte* base = file.mapping_->data();
  const size_t file_size = file.mapping_->size();
  if (file_size < 8) fail(path, "truncated: " + std::to_string(file_size) + " bytes, too short for the 8-byte header length");
  uint64_t header_bytes;
  std::memcpy(&header_bytes, base, 8);
  if (header_bytes < 2 || header_bytes > max_header_bytes) {
    fail(path, "header length " + std::to_string(header_bytes) + " is not plausible (expected 2.." +
                   std::to_string(max_header_bytes) + ")");
  }
  if (header_bytes > file_size - 8) {
    fail(path, "truncated: header length " + std::to_string(header_bytes) + " runs past the end of the " +
                   std::to_string(file_size) + "-byte file");
  }
  const char* header_text = reinterpret_cast<const char*>(base + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text, header_text + header_bytes);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  const std::byte* data_area = base + 8 + header_bytes;
  const uint64_t data_bytes = file_size - 8 - header_bytes;
  struct extent {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<extent> extents;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      fail(path, "tensor '" + name + "' needs dtype, shape and data_offsets");
    }
    if (!entry["dtype"].is_string()) fail(path, "tensor '" + name + "' has a non-string dtype");
    std::string dtype_name_text = entry["dtype"].get<std::string>();
    weight_tensor tensor;
    tensor.name = name;
    if (!parse_dtype(dtype_name_text, tensor.type)) {
      throw std::runtime_error("unsupported dtype " + dtype_name_text + " in tensor " + name + " of file " +
                               path.string() + " (supported: F32, F16, BF16)");
    }
    const auto& shape = entry["shape"];
    if (!shape.is_array()) fail(path, "tensor '" + name + "' has a non-array shape");
    uint64_t num_elements = 1;
    for (const auto& dim : shape) {
      if (!dim.is_number_unsigned()) fail(path, "tensor '" + name + "' has a negative or non-integer dimension");
      uint64_t d = dim.get<uint64_t>();
      if (d != 0 && num_elements > (uint64_t{1} << 62) / d) fail(path, "tensor '" + name + "' shape overflows");
      num_elements *= d;
      tensor.shape.push_back(static_cast<int64_t>(d));
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      fail(path, "tensor '" + name + "' data_offsets must be two non-negative integers");
    }
    uint64_t begin = offsets[0].get<uint64_t>();
    uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_bytes) {
      fail(path, "tensor '" + name + "' data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     "] lie outside the " + std::to_string(data_bytes) + "-byte data area (truncated file or lying header)");
    }
    uint64_t expected = row_bytes(tensor.type, static_cast<int64_t>(num_elements));
    if (end - begin != expected) {
      fail(path, "tensor '" + name + "' holds " + std::to_string(end - begin) + " bytes but shape × " +
                     dtype_name_text + " needs " + std::to_string(expected));
    }
    tensor.data = data_area + begin;
    tensor.num_bytes = end - begin;
    extents.push_back({begin, end, name});
    file.tensors_.push_back(std::move(tensor));
  }
  std::sort(extents.begin(), extents.end(), [](const extent& a, const extent& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i].begin < extents[i - 1].end) {
      fail(path, "tensors '" + extents[i - 1].name + "' and '" + extents[i].name + "' overlap");
    }
  }
  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const weight_tensor& a, const weight_tensor& b) { return a.data < b.data; });
  return file;
}

void safetensors_file::add_to(weight_store& store) const {
  store.keep_alive(mapping_);
  for (const auto& tensor : tensors_) store.add(tensor);
}

void load_safetensors_directory(const std::filesystem::path& directory, weight_store& store) {
  std::filesystem::path index_path = directory / "model.safetensors.index.json";
  std::filesystem::path single_path = directory / "model.safetensors";
  if (!std::filesystem::exists(index_path)) {
    if (!std::filesystem::exists(single_path)) {
      throw std::runtime_error("no model.safetensors or model.safetensors.index.json in '" + directory.string() + "'");
    }
    safetensors_file::open(single_path).add_to(store);
    return;
  }
  nlohmann::json index = read_json_file(index_path);
  if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw std::runtime_error("'" + index_path.string() + "' has no weight_map object");
  }
  std::map<std::string, std::set<std::string>> names_by_shard;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) throw std::runtime_error("'" + index_path.string() + "': weight_map entry '" + name + "' is not a file name");
    std::string shard_name = shard.get<std::string>();
    if (shard_name.find('/') != std::string::npos || shard_name == "..") {
      throw std::runtime_error("'" + index_path.string() + "': shard name '" + shard_name + "' must be a plain file name");
    }
    names_by_shard[shard_name].insert(name);
  }
  for (const auto& [shard_name, names] : names_by_shard) {
    std::filesystem::path shard_path = directory / shard_name;
    if (!std::filesystem::exists(shard_path)) {
      throw std::runtime_error("shard '" + shard_path.string() + "' named by '" + index_path.string() + "' does not exist");
    }
    safetensors_file shard = safetensors_file::open(shard_path);
    store.keep_alive(shard.mapping());
    for (const auto& tensor : shard.tensors()) {
      if (!names.count(tensor.name)) {
        throw std::runtime_error("tensor '" + tensor.name + "' in shard '" + shard_path.string() +
                                 "' is not listed for that shard in the weight_map");
      }
      store.add(tensor);
    }
    for (const auto& name : names) {
      if (!store.contains(name)) {
        throw std::runtime_error("tensor '" + name + "' is mapped to shard '" + shard_path.string() + "' but is not in it");
      }
    }
  }
}

}  // namespace troupe
