#include "model/loader/dummy_weights.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "model/loader/float_conversion.hpp"
#include "model/quant/fp8.hpp"

namespace troupe {
namespace {

// splitmix64: tiny, portable and identical everywhere (std:: distributions are not).
uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in (0, 1).
double next_uniform(uint64_t& state) { return (static_cast<double>(next_random(state) >> 11) + 0.5) * 0x1.0p-53; }

// E4M3 with one scale per row (max |x| / 448), as per-channel FP8 checkpoints store matrices.
std::vector<float> quantize_fp8_rows(const std::vector<float>& values, int64_t cols, std::byte* out) {
  std::vector<float> scales(values.size() / static_cast<size_t>(cols));
  for (size_t r = 0; r < scales.size(); ++r) {
    float max_abs = 0.0f;
    for (int64_t c = 0; c < cols; ++c) max_abs = std::max(max_abs, std::fabs(values[r * cols + c]));
    scales[r] = max_abs > 0.0f ? max_abs / quant::fp8_e4m3_max : 1.0f;
    for (int64_t c = 0; c < cols; ++c) {
      out[r * cols + c] = static_cast<std::byte>(quant::f32_to_fp8_e4m3(values[r * cols + c] / scales[r]));
    }
  }
  return scales;
}

uint64_t hash_name(const std::string& name, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The memory the kernel says a new allocation can have without swapping (MemAvailable), in
// bytes; 0 when it cannot be read.
uint64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / double(uint64_t{1} << 30));
  return text;
}

// The type each tensor is stored in (norms and biases stay f32, rows that are not whole Q8_0
// blocks fall back to f16), as GGUF files do.
dtype stored_type(const tensor_spec& spec, dtype type) {
  if (type == dtype::q8_0 && (spec.shape.size() < 2 || spec.shape.back() % q8_0_block_size != 0)) {
    return spec.shape.size() < 2 ? dtype::f32 : dtype::f16;
  }
  if (type == dtype::fp8_e4m3 && spec.shape.size() < 2) return dtype::f32;
  return type;
}

}  // namespace

dummy_weight_bytes dummy_weights_bytes(const model_config& config, dtype type) {
  dummy_weight_bytes bytes;
  for (const auto& spec : expected_tensors(config)) {
    // Element counts in double first: an absurd config's product would overflow an integer.
    double count = 1;
    for (int64_t d : spec.shape) count *= static_cast<double>(d);
    const double per_element = static_cast<double>(row_bytes(stored_type(spec, type), 256 * 1024)) / (256 * 1024);
    bytes.weights += count * per_element;
    bytes.largest_values = std::max(bytes.largest_values, count * sizeof(float));
  }
  return bytes;
}

void check_dummy_weights_fit(const model_config& config, dtype type, const std::string& what) {
  const dummy_weight_bytes need = dummy_weights_bytes(config, type);
  const uint64_t available = available_memory_bytes();
  const double total = need.weights + need.largest_values;
  if (available > 0 && total > static_cast<double>(available)) {
    throw std::runtime_error("dummy weights of " + what + " need " + gib(need.weights) + " (" +
                             gib(need.largest_values) + " more while the largest tensor is made: hidden_size " +
                             std::to_string(config.hidden_size) + ", intermediate_size " +
                             std::to_string(config.intermediate_size) + ", " + std::to_string(config.num_layers) +
                             " layers, vocab " + std::to_string(config.vocab_size) + ") but " +
                             gib(static_cast<double>(available)) + " of memory is available");
  }
}

std::vector<float> dummy_tensor_values(const tensor_spec& spec, uint64_t seed, const dummy_init& init) {
  int64_t count = 1;
  for (int64_t d : spec.shape) count *= d;
  std::vector<float> values(static_cast<size_t>(count));
  uint64_t state = hash_name(spec.name, seed);
  if (spec.role == tensor_role::norm || spec.role == tensor_role::norm_offset) {
    // A (1 + w) norm stores the offset: centred on 0, it multiplies by about 1 as the others do.
    const float center = spec.role == tensor_role::norm ? 1.0f : 0.0f;
    for (auto& v : values) v = center + init.norm_jitter * static_cast<float>(2 * next_uniform(state) - 1);
    return values;
  }
  // Attention sinks are logits competing with the scores: of order 1, not of the weights' size.
  const double stddev = spec.role == tensor_role::sinks ? 1.0 : init.stddev;
  for (size_t i = 0; i < values.size(); i += 2) {  // Box-Muller gives two normals per draw
    double radius = std::sqrt(-2.0 * std::log(next_uniform(state)));
    double angle = 2 * std::numbers::pi * next_uniform(state);
    values[i] = static_cast<float>(stddev * radius * std::cos(angle));
    if (i + 1 < values.size()) values[i + 1] = static_cast<float>(stddev * radius * std::sin(angle));
  }
  return values;
}

weight_store make_dummy_weights(const model_config& config, dtype type, uint64_t seed, const dummy_init& init) {
  weight_store store;
  for (const auto& spec : expected_tensors(config)) {
    std::vector<float> values = dummy_tensor_values(spec, seed, init);
    const dtype tensor_type = stored_type(spec, type);
    auto buffer = std::make_shared<std::vector<std::byte>>(row_bytes(tensor_type, static_cast<int64_t>(values.size())));
    std::vector<float> row_scales;
    if (tensor_type == dtype::fp8_e4m3) {
      row_scales = quantize_fp8_rows(values, spec.shape.back(), buffer->data());
    } else {
      convert_from_f32(values, tensor_type, buffer->data());
    }
    weight_tensor tensor;
    tensor.name = spec.name;
    tensor.type = tensor_type;
    tensor.shape = spec.shape;
    tensor.data = buffer->data();
    tensor.num_bytes = buffer->size();
    tensor.row_scales = std::move(row_scales);
    store.keep_alive(buffer);
    store.add(std::move(tensor));
  }
  return store;
}

}  // namespace troupe
