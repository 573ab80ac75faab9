#pragma once
// Owning device allocation (cudaMalloc), movable, freed on destruction.

#include <cstddef>
#include <utility>

#include "kernels/cuda/cuda_check.hpp"

namespace troupe::cuda {

class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(size_t num_bytes) { allocate(num_bytes); }
  ~device_buffer() { release(); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), num_bytes_(std::exchange(other.num_bytes_, 0)) {}
  device_buffer& operator=(device_buffer&& other) noexcept {
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
    check(cudaMalloc(&data_, num_bytes), "cudaMalloc");
    num_bytes_ = num_bytes;
  }
  void release() {
    if (data_) cudaFree(data_);
    data_ = nullptr;
    num_bytes_ = 0;
  }

  void* get() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t size() const { return num_bytes_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  void* data_ = nullptr;
  size_t num_bytes_ = 0;
};

// Page-locked host memory: the only kind an asynchronous copy (and a CUDA graph) can overlap.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  ~pinned_buffer() { release(); }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;

  void allocate(size_t num_bytes) {
    release();
    if (num_bytes == 0) return;
    check(cudaMallocHost(&data_, num_bytes), "cudaMallocHost");
    num_bytes_ = num_bytes;
  }
  void release() {
    if (data_) cudaFreeHost(data_);
    data_ = nullptr;
    num_bytes_ = 0;
  }
  void* get() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t size() const { return num_bytes_; }

 private:
  void* data_ = nullptr;
  size_t num_bytes_ = 0;
};

}  // namespace troupe::cuda
