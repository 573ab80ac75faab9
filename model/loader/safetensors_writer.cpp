#include "model/loader/safetensors_writer.hpp"

#include <cstdio>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace troupe {

void write_safetensors(const std::filesystem::path& path, const std::vector<weight_tensor>& tensors) {
  std::vector<safetensors_tensor> stored;
  stored.reserve(tensors.size());
  for (const auto& tensor : tensors) {
    if (!tensor.plain()) {
      throw std::runtime_error("tensor '" + tensor.name +
                               "' has row scales or a column order, which safetensors cannot hold");
    }
    stored.push_back(
        {tensor.name, safetensors_dtype_name(tensor.type), tensor.shape, tensor.data, tensor.num_bytes, path});
  }
  write_safetensors(path, stored);
}

void write_safetensors(const std::filesystem::path& path, const std::vector<safetensors_tensor>& tensors) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& tensor : tensors) {
    if (!safetensors_element_bytes(tensor.type_name)) {
      throw std::runtime_error("tensor '" + tensor.name + "': safetensors dtype '" + tensor.type_name +
                               "' is not one Troupe writes");
    }
    header[tensor.name] = {
        {"dtype", tensor.type_name}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + tensor.num_bytes}}};
    offset += tensor.num_bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // keeps the data area 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write '" + path.string() + "'");
  uint64_t header_bytes = text.size();
  out.write(reinterpret_cast<const char*>(&header_bytes), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& tensor : tensors) {
    out.write(reinterpret_cast<const char*>(tensor.data), static_cast<std::streamsize>(tensor.num_bytes));
  }
  if (!out) throw std::runtime_error("failed writing '" + path.string() + "'");
}

int write_sharded_safetensors(const std::filesystem::path& directory, const std::vector<weight_tensor>& tensors,
                              uint64_t max_shard_bytes) {
  std::vector<std::vector<weight_tensor>> shards(1);
  uint64_t shard_bytes = 0;
  for (const auto& tensor : tensors) {
    if (!shards.back().empty() && shard_bytes + tensor.num_bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(tensor);
    shard_bytes += tensor.num_bytes;
  }
  nlohmann::ordered_json index;
  uint64_t total = 0;
  for (const auto& tensor : tensors) total += tensor.num_bytes;
  index["metadata"] = {{"total_size", total}};
  const int count = static_cast<int>(shards.size());
  for (int i = 0; i < count; ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", i + 1, count);
    write_safetensors(directory / name, shards[i]);
    for (const auto& tensor : shards[i]) index["weight_map"][tensor.name] = name;
  }
  std::ofstream out(directory / "model.safetensors.index.json", std::ios::trunc);
  out << index.dump(2) << "\n";
  if (!out) throw std::runtime_error("cannot write the index in '" + directory.string() + "'");
  return count;
}

}  // namespace troupe
