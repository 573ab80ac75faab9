#include "model/loader/importance_matrix.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "model/loader/gguf_file.hpp"

namespace troupe {
namespace {

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& problem) {
  throw std::runtime_error("importance matrix '" + path.string() + "': " + problem);
}

void check_values(const std::filesystem::path& path, const std::string& name, const std::vector<float>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]) || values[i] < 0) {
      fail(path, "entry '" + name + "' value " + std::to_string(i) + " is " + std::to_string(values[i]) +
                     ", expected a finite mean square (>= 0)");
    }
  }
}

importance_matrix load_gguf(const std::filesystem::path& path) {
  const gguf_file file = gguf_file::open(path);
  importance_matrix matrix;
  if (const gguf_value* datasets = file.find("imatrix.datasets"); datasets && datasets->value.is_array()) {
    for (const auto& name : datasets->value) {
      if (name.is_string()) matrix.datasets.push_back(name.get<std::string>());
    }
  }
  matrix.chunk_count = file.find_int("imatrix.chunk_count").value_or(0);

  const std::string sums_suffix = ".in_sum2", counts_suffix = ".counts";
  auto f32_values = [&](const gguf_tensor_info& info) {
    if (info.type != static_cast<uint32_t>(gguf_tensor_type::f32)) {
      fail(path, "tensor '" + info.name + "' is " + ggml_type_name(info.type) + ", expected F32");
    }
    std::vector<float> values(info.num_bytes / 4);
    std::memcpy(values.data(), info.data, info.num_bytes);
    return values;
  };
  for (const gguf_tensor_info& info : file.tensors()) {
    if (info.name.size() <= sums_suffix.size() ||
        info.name.compare(info.name.size() - sums_suffix.size(), sums_suffix.size(), sums_suffix) != 0) {
      continue;
    }
    const std::string name = info.name.substr(0, info.name.size() - sums_suffix.size());
    const gguf_tensor_info* counts_info = file.find_tensor(name + counts_suffix);
    if (!counts_info)
      fail(path, "entry '" + name + "' has sums (" + info.name + ") but no counts (" + name + counts_suffix + ")");
    std::vector<float> sums = f32_values(info);
    const std::vector<float> counts = f32_values(*counts_info);
    // [columns, matrices]: each matrix's sums are divided by its own count.
    if (counts.empty() || sums.size() % counts.size() != 0) {
      fail(path, "entry '" + name + "' has " + std::to_string(sums.size()) + " sums for " +
                     std::to_string(counts.size()) + " counts, expected a whole number of sums per count");
    }
    const size_t columns = sums.size() / counts.size();
    for (size_t m = 0; m < counts.size(); ++m) {
      if (!std::isfinite(counts[m]) || counts[m] < 0) {
        fail(path, "entry '" + name + "' count " + std::to_string(m) + " is " + std::to_string(counts[m]));
      }
      const float count = std::round(counts[m]);
      for (size_t c = 0; c < columns; ++c) {
        float& value = sums[m * columns + c];
        // A matrix never activated (an expert no token chose) counts as uniform, as llama.cpp does.
        value = count > 0 ? value / count : 1.0f;
      }
    }
    check_values(path, name, sums);
    matrix.entries.emplace(name, std::move(sums));
  }
  if (matrix.entries.empty()) fail(path, "has no '<tensor>.in_sum2' entries (is it an imatrix file?)");
  return matrix;
}

importance_matrix load_legacy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot be opened");
  auto read_i32 = [&](const std::string& what) {
    int32_t value = 0;
    in.read(reinterpret_cast<char*>(&value), 4);
    if (!in) fail(path, "truncated while reading " + what);
    return value;
  };
  importance_matrix matrix;
  matrix.legacy_format = true;
  const int32_t num_entries = read_i32("the entry count");
  if (num_entries < 1 || num_entries > (1 << 20)) {
    fail(path, "has " + std::to_string(num_entries) + " entries (neither a GGUF imatrix nor a legacy .dat file?)");
  }
  for (int32_t e = 0; e < num_entries; ++e) {
    const std::string which = "entry " + std::to_string(e);
    const int32_t length = read_i32(which + "'s name length");
    if (length <= 0 || length > 4096) fail(path, which + " has a name of " + std::to_string(length) + " bytes");
    std::string name(static_cast<size_t>(length), '\0');
    in.read(name.data(), length);
    if (!in) fail(path, "truncated in " + which + "'s name");
    const int32_t calls = read_i32("entry '" + name + "''s call count");
    const int32_t count = read_i32("entry '" + name + "''s value count");
    if (count <= 0 || count > (1 << 28)) fail(path, "entry '" + name + "' has " + std::to_string(count) + " values");
    std::vector<float> values(static_cast<size_t>(count));
    in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count) * 4);
    if (!in) fail(path, "truncated in entry '" + name + "''s " + std::to_string(count) + " values");
    // The tool stored each mean times its call count.
    if (calls > 0) {
      for (float& v : values) v /= static_cast<float>(calls);
    }
    check_values(path, name, values);
    matrix.entries[name] = std::move(values);
  }
  // The trailer (chunk count, dataset name) is optional.
  int32_t chunks = 0;
  if (in.read(reinterpret_cast<char*>(&chunks), 4)) {
    matrix.chunk_count = chunks;
    int32_t length = 0;
    if (in.read(reinterpret_cast<char*>(&length), 4) && length > 0 && length < 4096) {
      std::string dataset(static_cast<size_t>(length), '\0');
      if (in.read(dataset.data(), length)) matrix.datasets.push_back(dataset);
    }
  }
  return matrix;
}

}  // namespace

const std::vector<float>* importance_matrix::find(const std::string& tensor) const {
  auto it = entries.find(tensor);
  return it == entries.end() ? nullptr : &it->second;
}

importance_matrix load_importance_matrix(const std::filesystem::path& path) {
  std::ifstream probe(path, std::ios::binary);
  if (!probe) throw std::runtime_error("importance matrix '" + path.string() + "' cannot be opened");
  uint32_t magic = 0;
  probe.read(reinterpret_cast<char*>(&magic), 4);
  if (!probe) fail(path, "is shorter than 4 bytes");
  probe.close();
  return magic == gguf_magic ? load_gguf(path) : load_legacy(path);
}

}  // namespace troupe
