#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/paged_attention.cuh"

namespace troupe::cuda {

namespace {

// Raises the kernel's dynamic shared memory limit to the device's opt-in maximum, once per
// kernel and device: a graph capture must not be the first to do it.
template <typename T, typename KV>
size_t allow_large_smem() {
  auto* kernel = paged_attention_kernel<T, KV>;
  static thread_local int configured_device = -1;
  static thread_local size_t limit = 0;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  if (configured_device != device) {
    int optin = 0;
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin), "cudaFuncSetAttribute");
    configured_device = device;
    limit = static_cast<size_t>(optin);
  }
  return limit;
}

}  // namespace

void paged_attention(const paged_attention_params& p, dtype type, dtype kv_type, cudaStream_t stream) {
  if (p.num_work == 0) return;
  if (p.head_dim % 8 != 0) {
    throw std::runtime_error("CUDA paged_attention: head_dim " + std::to_string(p.head_dim) +
                             " is not a multiple of 8");
  }
  if (p.num_splits > 1 && (!p.partial_out || !p.partial_max || !p.partial_sum)) {
    throw std::runtime_error("CUDA paged_attention: " + std::to_string(p.num_splits) +
                             " splits need a workspace (partial_out/max/sum)");
  }
  dispatch_activation(type, "paged_attention", [&](auto tag) {
    using T = decltype(tag);
    const size_t smem = paged_attention_smem_bytes(p.rows_per_cta, p.head_dim);
    dispatch_kv(kv_type, "paged_attention", [&](auto kv_tag) {
      using KV = decltype(kv_tag);
      const size_t limit = allow_large_smem<T, KV>();
      if (smem > limit) {
        throw std::runtime_error("CUDA paged_attention: " + std::to_string(p.rows_per_cta) + " rows of head_dim " +
                                 std::to_string(p.head_dim) + " need " + std::to_string(smem) +
                                 " bytes of shared memory; the device allows " + std::to_string(limit));
      }
      const dim3 grid(p.num_work, p.num_kv_heads, p.num_splits);
      paged_attention_kernel<T, KV><<<grid, attention_threads, smem, stream>>>(p);
      check_launch("paged_attention_kernel");
    });
    if (p.num_splits > 1) {
      paged_attention_merge_kernel<T><<<dim3(p.num_work, p.num_kv_heads), attention_threads, 0, stream>>>(p);
      check_launch("paged_attention_merge_kernel");
    }
  });
}

}  // namespace troupe::cuda
