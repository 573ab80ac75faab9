#include "model/loader/gguf_file.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace troupe {
namespace {

// ggml allows at most 4 dimensions; more means a corrupt tensor info.
constexpr uint32_t max_dims = 4;
// Nested arrays deeper than this are corrupt (real files nest at most once).
constexpr int max_array_depth = 4;

class cursor {
 public:
  cursor(const std::filesystem::path& path, const std::byte* data, size_t size)
      : path_(path), data_(data), size_(size) {}

  [[noreturn]] void fail(const std::string& problem) const {
    throw std::runtime_error("GGUF file '" + path_.string() + "': " + problem + " (at byte " + std::to_string(offset_) +
                             ")");
  }
  size_t offset() const { return offset_; }
  size_t remaining() const { return size_ - offset_; }

  template <typename T>
  T read(const char* what) {
    if (remaining() < sizeof(T)) fail(std::string("truncated while reading ") + what);
    T value;
    std::memcpy(&value, data_ + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }

  std::string read_string(const char* what) {
    uint64_t length = read<uint64_t>(what);
    if (length > remaining())
      fail(std::string("truncated: ") + what + " of " + std::to_string(length) + " bytes runs past the end");
    std::string text(reinterpret_cast<const char*>(data_ + offset_), length);
    offset_ += length;
    return text;
  }

 private:
  const std::filesystem::path& path_;
  const std::byte* data_;
  size_t size_;
  size_t offset_ = 0;
};

size_t scalar_size(gguf_value_type type) {
  switch (type) {
    case gguf_value_type::uint8:
    case gguf_value_type::int8:
    case gguf_value_type::boolean: return 1;
    case gguf_value_type::uint16:
    case gguf_value_type::int16: return 2;
    case gguf_value_type::uint32:
    case gguf_value_type::int32:
    case gguf_value_type::float32: return 4;
    case gguf_value_type::uint64:
    case gguf_value_type::int64:
    case gguf_value_type::float64: return 8;
    case gguf_value_type::string: return 8;  // at least its length
    case gguf_value_type::array: return 12;  // at least its element type and count
  }
  return 0;
}

bool valid_value_type(uint32_t type) { return type <= static_cast<uint32_t>(gguf_value_type::float64); }

nlohmann::json read_value(cursor& in, gguf_value_type type, gguf_value_type* element_type, int depth) {
  switch (type) {
    case gguf_value_type::uint8: return in.read<uint8_t>("a uint8");
    case gguf_value_type::int8: return in.read<int8_t>("an int8");
    case gguf_value_type::uint16: return in.read<uint16_t>("a uint16");
    case gguf_value_type::int16: return in.read<int16_t>("an int16");
    case gguf_value_type::uint32: return in.read<uint32_t>("a uint32");
    case gguf_value_type::int32: return in.read<int32_t>("an int32");
    case gguf_value_type::float32: return in.read<float>("a float32");
    case gguf_value_type::uint64: return in.read<uint64_t>("a uint64");
    case gguf_value_type::int64: return in.read<int64_t>("an int64");
    case gguf_value_type::float64: return in.read<double>("a float64");
    case gguf_value_type::boolean: {
      uint8_t b = in.read<uint8_t>("a bool");
      if (b > 1) in.fail("bool value " + std::to_string(b) + " is neither 0 nor 1");
      return b != 0;
    }
    case gguf_value_type::string: return in.read_string("a string");
    case gguf_value_type::array: {
      if (depth >= max_array_depth) in.fail("arrays nested too deeply");
      uint32_t raw_element = in.read<uint32_t>("an array element type");
      if (!valid_value_type(raw_element)) in.fail("unknown array element type " + std::to_string(raw_element));
      auto element = static_cast<gguf_value_type>(raw_element);
      uint64_t count = in.read<uint64_t>("an array length");
      if (count > in.remaining() / scalar_size(element)) {
        in.fail("truncated: array of " + std::to_string(count) + " elements runs past the end");
      }
      if (element_type) *element_type = element;
      nlohmann::json values = nlohmann::json::array();
      values.get_ref<nlohmann::json::array_t&>().reserve(count);
      for (uint64_t i = 0; i < count; ++i) values.push_back(read_value(in, element, nullptr, depth + 1));
      return values;
    }
  }
  in.fail("unknown value type");
}

bool is_integer_type(gguf_value_type type) {
  switch (type) {
    case gguf_value_type::uint8:
    case gguf_value_type::int8:
    case gguf_value_type::uint16:
    case gguf_value_type::int16:
    case gguf_value_type::uint32:
    case gguf_value_type::int32:
    case gguf_value_type::uint64:
    case gguf_value_type::int64: return true;
    default: return false;
  }
}

}  // namespace

gguf_file gguf_file::open(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) throw std::runtime_error("GGUF file '" + path.string() + "' does not exist");
  gguf_file file;
  file.mapping_ = mapped_file::open(path);
  cursor in(path, file.mapping_->data(), file.mapping_->size());
  uint32_t magic = in.read<uint32_t>("the magic number");
  if (magic != gguf_magic) in.fail("not a GGUF file (bad magic)");
  file.version_ = in.read<uint32_t>("the version");
  if (file.version_ != 2 && file.version_ != 3) {
    in.fail("unsupported GGUF version " + std::to_string(file.version_) + " (supported: 2, 3)");
  }
  uint64_t num_tensors = in.read<uint64_t>("the tensor count");
  uint64_t num_keys = in.read<uint64_t>("the metadata count");
  // Each key/value takes at least 12 bytes and each tensor info at least 24: a count beyond
  // what the file could hold is a lie, caught before any allocation.
  if (num_keys > in.remaining() / 12) in.fail("metadata count " + std::to_string(num_keys) + " exceeds the file");
  if (num_tensors > in.remaining() / 24) in.fail("tensor count " + std::to_string(num_tensors) + " exceeds the file");

  for (uint64_t i = 0; i < num_keys; ++i) {
    std::string key = in.read_string("a metadata key");
    uint32_t raw_type = in.read<uint32_t>("a metadata value type");
    if (!valid_value_type(raw_type))
      in.fail("metadata key '" + key + "' has unknown value type " + std::to_string(raw_type));
    gguf_value value;
    value.type = static_cast<gguf_value_type>(raw_type);
    value.value = read_value(in, value.type, &value.element_type, 0);
    if (file.metadata_.count(key)) in.fail("duplicate metadata key '" + key + "'");
    file.keys_.push_back(key);
    file.metadata_.emplace(key, std::move(value));
  }
  if (auto alignment = file.find_int("general.alignment")) {
    if (*alignment <= 0 || (*alignment & (*alignment - 1)) != 0) {
      in.fail("general.alignment " + std::to_string(*alignment) + " is not a power of two");
    }
    file.alignment_ = static_cast<uint64_t>(*alignment);
  }

  for (uint64_t i = 0; i < num_tensors; ++i) {
    gguf_tensor_info info;
    info.name = in.read_string("a tensor name");
    uint32_t num_dims = in.read<uint32_t>("a tensor's dimension count");
    if (num_dims == 0 || num_dims > max_dims) {
      in.fail("tensor '" + info.name + "' has " + std::to_string(num_dims) + " dimensions (expected 1.." +
              std::to_string(max_dims) + ")");
    }
    uint64_t num_elements = 1;
    for (uint32_t d = 0; d < num_dims; ++d) {
      int64_t dim = in.read<int64_t>("a tensor dimension");
      if (dim <= 0 || static_cast<uint64_t>(dim) > (uint64_t{1} << 62) / num_elements) {
        in.fail("tensor '" + info.name + "' has invalid dimension " + std::to_string(dim));
      }
      num_elements *= static_cast<uint64_t>(dim);
      info.dims.push_back(dim);
    }
    info.type = in.read<uint32_t>("a tensor type");
    info.offset = in.read<uint64_t>("a tensor offset");
    if (auto type = info.element_type()) {
      const int64_t block = dtype_block_size(*type);
      if (info.dims[0] % block != 0) {
        in.fail(ggml_type_name(info.type) + " tensor '" + info.name + "' has a row of " + std::to_string(info.dims[0]) +
                " values, not a multiple of its block of " + std::to_string(block));
      }
      info.num_bytes = row_bytes(*type, static_cast<int64_t>(num_elements));
    }
    if (file.tensor_index_.count(info.name)) in.fail("duplicate tensor '" + info.name + "'");
    file.tensor_index_.emplace(info.name, file.tensors_.size());
    file.tensors_.push_back(std::move(info));
  }

  const uint64_t data_start = (in.offset() + file.alignment_ - 1) / file.alignment_ * file.alignment_;
  const uint64_t file_size = file.mapping_->size();
  const uint64_t data_bytes = data_start <= file_size ? file_size - data_start : 0;
  std::vector<const gguf_tensor_info*> by_offset;
  for (auto& info : file.tensors_) {
    if (info.offset % file.alignment_ != 0) {
      throw std::runtime_error("GGUF file '" + path.string() + "': tensor '" + info.name + "' offset " +
                               std::to_string(info.offset) + " is not aligned to " + std::to_string(file.alignment_));
    }
    if (info.offset > data_bytes || info.num_bytes > data_bytes - info.offset) {
      throw std::runtime_error("GGUF file '" + path.string() + "': tensor '" + info.name + "' data [" +
                               std::to_string(info.offset) + ", " + std::to_string(info.offset + info.num_bytes) +
                               ") lies outside the " + std::to_string(data_bytes) +
                               "-byte data section (truncated file?)");
    }
    info.data = file.mapping_->data() + data_start + info.offset;
    if (info.num_bytes) by_offset.push_back(&info);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->num_bytes) {
      throw std::runtime_error("GGUF file '" + path.string() + "': tensors '" + by_offset[i - 1]->name + "' and '" +
                               by_offset[i]->name + "' overlap");
    }
  }
  return file;
}

const gguf_value* gguf_file::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::optional<int64_t> gguf_file::find_int(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (!is_integer_type(v->type)) {
    throw std::runtime_error("GGUF file '" + path().string() + "': metadata '" + key + "' is not an integer");
  }
  return v->value.is_number_unsigned() ? static_cast<int64_t>(v->value.get<uint64_t>()) : v->value.get<int64_t>();
}

std::optional<double> gguf_file::find_float(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (!v->value.is_number())
    throw std::runtime_error("GGUF file '" + path().string() + "': metadata '" + key + "' is not a number");
  return v->value.get<double>();
}

std::optional<std::string> gguf_file::find_string(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_value_type::string)
    throw std::runtime_error("GGUF file '" + path().string() + "': metadata '" + key + "' is not a string");
  return v->value.get<std::string>();
}

std::optional<bool> gguf_file::find_bool(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_value_type::boolean)
    throw std::runtime_error("GGUF file '" + path().string() + "': metadata '" + key + "' is not a bool");
  return v->value.get<bool>();
}

namespace {
[[noreturn]] void missing(const std::filesystem::path& path, const std::string& key) {
  throw std::runtime_error("GGUF file '" + path.string() + "' has no metadata key '" + key + "'");
}
}  // namespace

int64_t gguf_file::get_int(const std::string& key) const {
  if (auto v = find_int(key)) return *v;
  missing(path(), key);
}

double gguf_file::get_float(const std::string& key) const {
  if (auto v = find_float(key)) return *v;
  missing(path(), key);
}

std::string gguf_file::get_string(const std::string& key) const {
  if (auto v = find_string(key)) return *v;
  missing(path(), key);
}

const nlohmann::json& gguf_file::get_array(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v) missing(path(), key);
  if (v->type != gguf_value_type::array)
    throw std::runtime_error("GGUF file '" + path().string() + "': metadata '" + key + "' is not an array");
  return v->value;
}

const gguf_tensor_info* gguf_file::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

weight_tensor gguf_file::view(const gguf_tensor_info& info, const std::string& name) const {
  auto type = info.element_type();
  if (!type) {
    throw std::runtime_error("tensor '" + info.name + "' of file " + path().string() + " has type " +
                             ggml_type_name(info.type) + " (ggml type " + std::to_string(info.type) +
                             "), which Troupe does not load (it loads " + loadable_ggml_type_names() + ")");
  }
  weight_tensor tensor;
  tensor.name = name;
  tensor.type = *type;
  tensor.shape = info.shape();
  tensor.data = info.data;
  tensor.num_bytes = info.num_bytes;
  return tensor;
}

}  // namespace troupe
