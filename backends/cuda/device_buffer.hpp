#pragma once
// Owning CUDA allocations, movable, freed on destruction: device memory (device_buffer) and
// page-locked host memory (pinned_buffer), one class for both.

#include <cstddef>
#include <utility>

#include "backends/cuda/cuda_check.hpp"

namespace troupe::cuda {

// Where an allocation lives: how to get it, how to give it back, and the name an error gives.
struct device_memory {
  static cudaError_t allocate(void** data, size_t num_bytes) { return cudaMalloc(data, num_bytes); }
  static void release(void* data) { cudaFree(data); }
  static constexpr const char* allocator = "cudaMalloc";
};

// Page-locked host memory: the only kind an asynchronous copy (and a CUDA graph) can overlap.
struct pinned_host_memory {
  static cudaError_t allocate(void** data, size_t num_bytes) { return cudaMallocHost(data, num_bytes); }
  static void release(void* data) { cudaFreeHost(data); }
  static constexpr const char* allocator = "cudaMallocHost";
};

// One owning allocation of `Memory`, movable, freed on destruction.
template <class Memory>
class cuda_allocation {
 public:
  cuda_allocation() = default;
  explicit cuda_allocation(size_t num_bytes) { allocate(num_bytes); }
  ~cuda_allocation() { release(); }
  cuda_allocation(const cuda_allocation&) = delete;
  cuda_allocation& operator=(const cuda_allocation&) = delete;
  cuda_allocation(cuda_allocation&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), num_bytes_(std::exchange(other.num_bytes_, 0)) {}
  cuda_allocation& operator=(cuda_allocation&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      num_bytes_ = std::exchange(other.num_bytes_, 0);
    }
    return *this;
  }

  void allocate(size_t num_bytes) {
    release();
    if (num_bytes == 0) return;
    check(Memory::allocate(&data_, num_bytes), Memory::allocator);
    num_bytes_ = num_bytes;
  }
  void release() {
    if (data_) Memory::release(data_);
    data_ = nullptr;
    num_bytes_ = 0;
  }

  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return num_bytes_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  void* data_ = nullptr;
  size_t num_bytes_ = 0;
};

using device_buffer = cuda_allocation<device_memory>;
using pinned_buffer = cuda_allocation<pinned_host_memory>;

}  // namespace troupe::cuda
