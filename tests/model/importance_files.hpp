#pragma once
// Writes importance matrices in the two formats llama.cpp's imatrix tool writes
// (tools/imatrix/imatrix.cpp in llama.cpp: save_imatrix and save_imatrix_legacy), for the
// quantizer's tests: GGUF with "<name>.in_sum2" sums of squares [columns, matrices] and
// "<name>.counts" [1, matrices], and the legacy .dat (per entry: name, call count, value count,
// the means times the call count; then the chunk count and the dataset's name).

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "model/loader/gguf_writer.hpp"

namespace troupe::testing {

// `means`: tensor name -> mean square per column (one matrix each); `count` activations each.
inline void write_gguf_imatrix(const std::filesystem::path& path,
                               const std::map<std::string, std::vector<float>>& means, float count = 512.0f) {
  gguf_writer writer;
  writer.set("general.type", gguf_value::string("imatrix"));
  writer.set("imatrix.datasets", gguf_value::array(gguf_value_type::string, {"calibration.txt"}));
  writer.set("imatrix.chunk_count", gguf_value::u32(4));
  writer.set("imatrix.chunk_size", gguf_value::u32(128));
  auto bytes_of = [](const std::vector<float>& values) {
    std::vector<std::byte> bytes(values.size() * 4);
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
  };
  for (const auto& [name, values] : means) {
    std::vector<float> sums(values);
    for (float& v : sums) v *= count;
    writer.add_tensor(name + ".in_sum2", gguf_tensor_type::f32, {static_cast<int64_t>(values.size()), 1},
                      bytes_of(sums));
    writer.add_tensor(name + ".counts", gguf_tensor_type::f32, {1, 1}, bytes_of({count}));
  }
  writer.write(path);
}

inline void write_legacy_imatrix(const std::filesystem::path& path,
                                 const std::map<std::string, std::vector<float>>& means, int32_t calls = 10) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  auto put_i32 = [&](int32_t v) { out.write(reinterpret_cast<const char*>(&v), 4); };
  put_i32(static_cast<int32_t>(means.size()));
  for (const auto& [name, values] : means) {
    put_i32(static_cast<int32_t>(name.size()));
    out.write(name.data(), static_cast<std::streamsize>(name.size()));
    put_i32(calls);
    put_i32(static_cast<int32_t>(values.size()));
    for (float v : values) {
      const float stored = v * static_cast<float>(calls);
      out.write(reinterpret_cast<const char*>(&stored), 4);
    }
  }
  put_i32(4);  // chunks
  const std::string dataset = "calibration.txt";
  put_i32(static_cast<int32_t>(dataset.size()));
  out.write(dataset.data(), static_cast<std::streamsize>(dataset.size()));
}

}  // namespace troupe::testing
