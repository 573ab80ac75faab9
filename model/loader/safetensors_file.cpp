#include "model/loader/safetensors_file.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "model/loader/hf_config.hpp"
#include "model/quant/block_fields.hpp"
#include "model/quant/fp8.hpp"

namespace troupe {
namespace {

// A header bigger than this is not a safetensors header (the format's own limit is 100 MB).
constexpr uint64_t max_header_bytes = 100'000'000;

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& problem) {
  throw std::runtime_error("safetensors file '" + path.string() + "': " + problem);
}

struct known_dtype {
  std::string_view name;
  size_t element_bytes;
  std::optional<dtype> weight_type;
};

constexpr known_dtype known_dtypes[] = {
    {"F32", 4, dtype::f32},          {"F16", 2, dtype::f16},   {"BF16", 2, dtype::bf16},
    {"F8_E4M3", 1, dtype::fp8_e4m3}, {"I64", 8, std::nullopt}, {"I32", 4, std::nullopt},
    {"I16", 2, std::nullopt},        {"I8", 1, std::nullopt},  {"U8", 1, std::nullopt},
};

const known_dtype* find_dtype(std::string_view name) {
  for (const auto& known : known_dtypes) {
    if (known.name == name) return &known;
  }
  return nullptr;
}

}  // namespace

std::optional<size_t> safetensors_element_bytes(std::string_view type_name) {
  const known_dtype* known = find_dtype(type_name);
  if (!known) return std::nullopt;
  return known->element_bytes;
}

const char* safetensors_dtype_name(dtype type) {
  switch (type) {
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::fp8_e4m3: return "F8_E4M3";
    default: break;
  }
  throw std::runtime_error("safetensors cannot hold " + std::string(dtype_name(type)) + " tensors");
}

int64_t safetensors_tensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t safetensors_tensor::integer_at(int64_t i) const {
  if (type_name == "I32") return static_cast<int32_t>(quant::read_u32(data + 4 * i));
  if (type_name == "I64") {
    int64_t value;
    std::memcpy(&value, data + 8 * i, 8);
    return value;
  }
  if (type_name == "I16") return static_cast<int16_t>(quant::read_u16(data + 2 * i));
  if (type_name == "I8") return static_cast<int8_t>(quant::bytes_at(data)[i]);
  if (type_name == "U8") return quant::bytes_at(data)[i];
  throw std::runtime_error("tensor " + name + " of file " + file.string() + " is " + type_name +
                           ", expected an integer type");
}

float safetensors_tensor::float_at(int64_t i) const {
  if (type_name == "F32") {
    float value;
    std::memcpy(&value, data + 4 * i, 4);
    return value;
  }
  if (type_name == "F16") return f16_to_f32(quant::read_u16(data + 2 * i));
  if (type_name == "BF16") return bf16_to_f32(quant::read_u16(data + 2 * i));
  if (type_name == "F8_E4M3") return quant::fp8_e4m3_to_f32(quant::bytes_at(data)[i]);
  throw std::runtime_error("tensor " + name + " of file " + file.string() + " is " + type_name +
                           ", expected a float type");
}

std::optional<dtype> safetensors_tensor::weight_type() const {
  const known_dtype* known = find_dtype(type_name);
  return known ? known->weight_type : std::nullopt;
}

weight_tensor safetensors_tensor::as_weight() const {
  const std::optional<dtype> type = weight_type();
  if (!type) {
    throw std::runtime_error("unsupported dtype " + type_name + " in tensor " + name + " of file " + file.string() +
                             " (weights may be F32, F16, BF16 or F8_E4M3; integer tensors only as the packed weights "
                             "of a checkpoint whose config.json names its quantization_config)");
  }
  weight_tensor tensor;
  tensor.name = name;
  tensor.type = *type;
  tensor.shape = shape;
  tensor.data = data;
  tensor.num_bytes = num_bytes;
  return tensor;
}

safetensors_file safetensors_file::open(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) fail(path, "file does not exist");
  safetensors_file file;
  file.mapping_ = mapped_file::open(path);
  const std::byte* base = file.mapping_->data();
  const size_t file_size = file.mapping_->size();
  if (file_size < 8)
    fail(path, "truncated: " + std::to_string(file_size) + " bytes, too short for the 8-byte header length");
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
    safetensors_tensor tensor;
    tensor.name = name;
    tensor.type_name = dtype_name_text;
    tensor.file = path;
    const known_dtype* known = find_dtype(dtype_name_text);
    if (!known) {
      throw std::runtime_error("unsupported dtype " + dtype_name_text + " in tensor " + name + " of file " +
                               path.string() +
                               " (supported: F32, F16, BF16, F8_E4M3; I64, I32, I16, I8, U8 in "
                               "quantized checkpoints)");
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
                     "] lie outside the " + std::to_string(data_bytes) +
                     "-byte data area (truncated file or lying header)");
    }
    uint64_t expected = num_elements * known->element_bytes;
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
            [](const safetensors_tensor& a, const safetensors_tensor& b) { return a.data < b.data; });
  return file;
}

void safetensors_file::add_to(weight_store& store) const {
  store.keep_alive(mapping_);
  for (const auto& tensor : tensors_) store.add(tensor.as_weight());
}

const safetensors_tensor* safetensors_checkpoint::find(const std::string& name) const {
  for (const auto& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

safetensors_checkpoint read_safetensors_directory(const std::filesystem::path& directory) {
  safetensors_checkpoint checkpoint;
  std::filesystem::path index_path = directory / "model.safetensors.index.json";
  std::filesystem::path single_path = directory / "model.safetensors";
  if (!std::filesystem::exists(index_path)) {
    if (!std::filesystem::exists(single_path)) {
      throw std::runtime_error("no model.safetensors or model.safetensors.index.json in '" + directory.string() + "'");
    }
    safetensors_file file = safetensors_file::open(single_path);
    checkpoint.mappings.push_back(file.mapping());
    checkpoint.tensors = file.tensors();
    return checkpoint;
  }
  nlohmann::json index = read_json_file(index_path);
  if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw std::runtime_error("'" + index_path.string() + "' has no weight_map object");
  }
  std::map<std::string, std::set<std::string>> names_by_shard;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string())
      throw std::runtime_error("'" + index_path.string() + "': weight_map entry '" + name + "' is not a file name");
    std::string shard_name = shard.get<std::string>();
    if (shard_name.find('/') != std::string::npos || shard_name == "..") {
      throw std::runtime_error("'" + index_path.string() + "': shard name '" + shard_name +
                               "' must be a plain file name");
    }
    names_by_shard[shard_name].insert(name);
  }
  for (const auto& [shard_name, names] : names_by_shard) {
    std::filesystem::path shard_path = directory / shard_name;
    if (!std::filesystem::exists(shard_path)) {
      throw std::runtime_error("shard '" + shard_path.string() + "' named by '" + index_path.string() +
                               "' does not exist");
    }
    safetensors_file shard = safetensors_file::open(shard_path);
    checkpoint.mappings.push_back(shard.mapping());
    std::set<std::string> found;
    for (const auto& tensor : shard.tensors()) {
      if (!names.count(tensor.name)) {
        throw std::runtime_error("tensor '" + tensor.name + "' in shard '" + shard_path.string() +
                                 "' is not listed for that shard in the weight_map");
      }
      found.insert(tensor.name);
      checkpoint.tensors.push_back(tensor);
    }
    for (const auto& name : names) {
      if (!found.count(name)) {
        throw std::runtime_error("tensor '" + name + "' is mapped to shard '" + shard_path.string() +
                                 "' but is not in it");
      }
    }
  }
  return checkpoint;
}

void load_safetensors_directory(const std::filesystem::path& directory, weight_store& store) {
  safetensors_checkpoint checkpoint = read_safetensors_directory(directory);
  for (const auto& mapping : checkpoint.mappings) store.keep_alive(mapping);
  for (const auto& tensor : checkpoint.tensors) store.add(tensor.as_weight());
}

}  // namespace troupe
