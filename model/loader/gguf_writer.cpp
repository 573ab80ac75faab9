#include "model/loader/gguf_writer.hpp"

#include <fstream>
#include <stdexcept>

namespace troupe {
namespace {

class byte_sink {
 public:
  template <typename T>
  void put(T value) {
    const auto* bytes = reinterpret_cast<const char*>(&value);
    buffer_.insert(buffer_.end(), bytes, bytes + sizeof(T));
  }
  void put_string(const std::string& text) {
    put<uint64_t>(text.size());
    buffer_.insert(buffer_.end(), text.begin(), text.end());
  }
  void pad_to(uint64_t alignment) {
    while (buffer_.size() % alignment != 0) buffer_.push_back(0);
  }
  const std::vector<char>& bytes() const { return buffer_; }

 private:
  std::vector<char> buffer_;
};

void put_value(byte_sink& out, gguf_value_type type, gguf_value_type element_type, const nlohmann::json& value,
               const std::string& key) {
  switch (type) {
    case gguf_value_type::uint8: out.put(value.get<uint8_t>()); return;
    case gguf_value_type::int8: out.put(value.get<int8_t>()); return;
    case gguf_value_type::uint16: out.put(value.get<uint16_t>()); return;
    case gguf_value_type::int16: out.put(value.get<int16_t>()); return;
    case gguf_value_type::uint32: out.put(value.get<uint32_t>()); return;
    case gguf_value_type::int32: out.put(value.get<int32_t>()); return;
    case gguf_value_type::float32: out.put(value.get<float>()); return;
    case gguf_value_type::uint64: out.put(value.get<uint64_t>()); return;
    case gguf_value_type::int64: out.put(value.get<int64_t>()); return;
    case gguf_value_type::float64: out.put(value.get<double>()); return;
    case gguf_value_type::boolean: out.put<uint8_t>(value.get<bool>() ? 1 : 0); return;
    case gguf_value_type::string: out.put_string(value.get<std::string>()); return;
    case gguf_value_type::array:
      if (element_type == gguf_value_type::array) {
        throw std::runtime_error("GGUF writer: nested arrays are not supported (key '" + key + "')");
      }
      if (!value.is_array())
        throw std::runtime_error("GGUF writer: key '" + key + "' is typed array but holds no array");
      out.put(static_cast<uint32_t>(element_type));
      out.put<uint64_t>(value.size());
      for (const auto& element : value) put_value(out, element_type, gguf_value_type::uint8, element, key);
      return;
  }
}

}  // namespace

void gguf_writer::set(const std::string& key, gguf_value value) {
  for (auto& [existing, old] : metadata_) {
    if (existing == key) {
      old = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

void gguf_writer::add_tensor(const std::string& name, gguf_tensor_type type, std::vector<int64_t> dims,
                             std::vector<std::byte> data) {
  const size_t num_bytes = data.size();
  add_tensor(name, type, std::move(dims), num_bytes, nullptr);
  tensors_.back().data = std::move(data);
}

void gguf_writer::add_tensor(const std::string& name, gguf_tensor_type type, std::vector<int64_t> dims,
                             size_t num_bytes, tensor_producer produce) {
  for (const auto& tensor : tensors_) {
    if (tensor.name == name) throw std::runtime_error("GGUF writer: duplicate tensor '" + name + "'");
  }
  tensors_.push_back({name, type, std::move(dims), {}, num_bytes, std::move(produce)});
}

void gguf_writer::erase(const std::string& key) {
  std::erase_if(metadata_, [&](const auto& entry) { return entry.first == key; });
}

uint64_t gguf_writer::alignment() const {
  for (const auto& [key, value] : metadata_) {
    if (key == "general.alignment") return value.value.get<uint64_t>();
  }
  return gguf_default_alignment;
}

void gguf_writer::write(const std::filesystem::path& path) const {
  const uint64_t align = alignment();
  byte_sink header;
  header.put(gguf_magic);
  header.put<uint32_t>(3);
  header.put<uint64_t>(tensors_.size());
  header.put<uint64_t>(metadata_.size());
  for (const auto& [key, value] : metadata_) {
    header.put_string(key);
    header.put(static_cast<uint32_t>(value.type));
    put_value(header, value.type, value.element_type, value.value, key);
  }
  uint64_t offset = 0;
  for (const auto& tensor : tensors_) {
    header.put_string(tensor.name);
    header.put<uint32_t>(tensor.dims.size());
    for (int64_t d : tensor.dims) header.put(d);
    header.put(static_cast<uint32_t>(tensor.type));
    header.put(offset);
    offset = (offset + tensor.num_bytes + align - 1) / align * align;
  }
  header.pad_to(align);

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write '" + path.string() + "'");
  out.write(header.bytes().data(), static_cast<std::streamsize>(header.bytes().size()));
  const std::vector<char> zeros(align, 0);
  std::vector<std::byte> produced;
  for (const auto& tensor : tensors_) {
    const std::byte* bytes = tensor.data.data();
    if (tensor.produce) {
      produced.assign(tensor.num_bytes, std::byte{0});
      tensor.produce(produced.data());
      bytes = produced.data();
    }
    out.write(reinterpret_cast<const char*>(bytes), static_cast<std::streamsize>(tensor.num_bytes));
    uint64_t padding = (align - tensor.num_bytes % align) % align;
    out.write(zeros.data(), static_cast<std::streamsize>(padding));
  }
  if (!out) throw std::runtime_error("failed writing '" + path.string() + "'");
}

}  // namespace troupe
