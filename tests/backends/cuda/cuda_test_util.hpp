#pragma once
// Shared plumbing for the CUDA tests: skipping without a GPU, moving f32 test data to and from
// the device in any activation dtype, poisoning outputs, and the normalized error measure.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/cuda_model.hpp"
#include "backends/cuda/device_buffer.hpp"
#include "model/dtype.hpp"

// Every CUDA test starts with this: machines without a GPU skip, saying why.
#define TROUPE_REQUIRE_GPU()                                   \
  do {                                                         \
    std::string troupe_why;                                    \
    if (!troupe::cuda_device_available(&troupe_why)) {         \
      GTEST_SKIP() << "CUDA test needs a GPU: " << troupe_why; \
    }                                                          \
  } while (0)

namespace troupe::cuda::testing {

inline size_t element_size(dtype type) { return type == dtype::f32 ? 4 : 2; }

// The value a float becomes when stored as `type` (host side, round to nearest even).
inline float round_to(dtype type, float value) {
  switch (type) {
    case dtype::bf16: return __bfloat162float(__float2bfloat16_rn(value));
    case dtype::f16: return __half2float(__float2half_rn(value));
    default: return value;
  }
}

inline std::vector<float> rounded(dtype type, std::vector<float> values) {
  for (float& v : values) v = round_to(type, v);
  return values;
}

// Host bytes of `values` stored as `type`.
inline std::vector<std::byte> encode(dtype type, const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * element_size(type));
  for (size_t i = 0; i < values.size(); ++i) {
    if (type == dtype::f32) {
      std::memcpy(bytes.data() + 4 * i, &values[i], 4);
    } else if (type == dtype::bf16) {
      const __nv_bfloat16 h = __float2bfloat16_rn(values[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    } else {
      const __half h = __float2half_rn(values[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

inline std::vector<float> decode(dtype type, const std::byte* bytes, size_t n) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) {
    if (type == dtype::f32) {
      std::memcpy(&values[i], bytes + 4 * i, 4);
    } else if (type == dtype::bf16) {
      __nv_bfloat16 h;
      std::memcpy(&h, bytes + 2 * i, 2);
      values[i] = __bfloat162float(h);
    } else {
      __half h;
      std::memcpy(&h, bytes + 2 * i, 2);
      values[i] = __half2float(h);
    }
  }
  return values;
}

inline device_buffer to_device(dtype type, const std::vector<float>& values) {
  const std::vector<std::byte> bytes = encode(type, values);
  device_buffer buffer(std::max<size_t>(bytes.size(), 16));
  check(cudaMemcpy(buffer.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "test upload");
  return buffer;
}

template <typename T>
device_buffer to_device_raw(const std::vector<T>& values) {
  device_buffer buffer(std::max<size_t>(values.size() * sizeof(T), 16));
  check(cudaMemcpy(buffer.get(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice), "test upload");
  return buffer;
}

inline std::vector<float> from_device(dtype type, const void* device, size_t n) {
  check(cudaDeviceSynchronize(), "test sync");
  std::vector<std::byte> bytes(n * element_size(type));
  check(cudaMemcpy(bytes.data(), device, bytes.size(), cudaMemcpyDeviceToHost), "test download");
  return decode(type, bytes.data(), n);
}

template <typename T>
std::vector<T> from_device_raw(const void* device, size_t n) {
  check(cudaDeviceSynchronize(), "test sync");
  std::vector<T> values(n);
  check(cudaMemcpy(values.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), "test download");
  return values;
}

// All-ones bytes are NaN in f32, f16 and bf16: an output element a kernel forgets stays NaN.
inline device_buffer poisoned(size_t num_bytes) {
  device_buffer buffer(std::max<size_t>(num_bytes, 16));
  check(cudaMemset(buffer.get(), 0xff, buffer.size()), "poison");
  return buffer;
}

inline std::vector<float> random_values(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

// ||out - ref|| / ||ref||; infinity when any output is not finite.
inline double normalized_error(const std::vector<float>& out, const std::vector<double>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    diff += (out[i] - ref[i]) * (out[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

inline double normalized_error(const std::vector<float>& out, const std::vector<float>& ref) {
  return normalized_error(out, std::vector<double>(ref.begin(), ref.end()));
}

// Tolerance for results computed from inputs already rounded to `type`, with f32 arithmetic and
// outputs rounded to `type` once or a few times.
inline double tolerance(dtype type) {
  switch (type) {
    case dtype::bf16: return 1e-2;
    case dtype::f16: return 2e-3;
    default: return 1e-5;
  }
}

inline const std::vector<dtype>& activation_types() {
  static const std::vector<dtype> types{dtype::f32, dtype::f16, dtype::bf16};
  return types;
}

}  // namespace troupe::cuda::testing
