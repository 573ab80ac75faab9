#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/kv_cache_store.cuh"
#include "backends/cuda/ops.hpp"

namespace troupe::cuda {

void kv_cache_store(const void* k, const void* v, int64_t row_stride, const int64_t* slot_mapping, void* k_cache,
                    void* v_cache, int num_tokens, int num_kv_heads, int head_dim, dtype type, dtype kv_type,
                    cudaStream_t stream) {
  if (num_tokens == 0) return;
  const int width = num_kv_heads * head_dim;
  dispatch_activation(type, "kv_cache_store", [&](auto tag) {
    using T = decltype(tag);
    if (kv_type == type) {
      const int threads = std::min(256, ((width + 31) / 32) * 32);
      kv_cache_store_kernel<T><<<num_tokens, threads, 0, stream>>>(static_cast<const T*>(k), static_cast<const T*>(v),
                                                                   row_stride, slot_mapping, static_cast<T*>(k_cache),
                                                                   static_cast<T*>(v_cache), width);
      check_launch("kv_cache_store_kernel");
      return;
    }
    dispatch_kv(kv_type, "kv_cache_store", [&](auto kv_tag) {
      using KV = decltype(kv_tag);
      const int units = width / kv_access<KV>::unit;
      const int threads = std::min(256, ((units + 31) / 32) * 32);
      const int64_t slot_bytes = static_cast<int64_t>(row_bytes(kv_type, width));
      kv_cache_store_converting_kernel<T, KV><<<num_tokens, threads, 0, stream>>>(
          static_cast<const T*>(k), static_cast<const T*>(v), row_stride, slot_mapping, static_cast<char*>(k_cache),
          static_cast<char*>(v_cache), width, slot_bytes);
      check_launch("kv_cache_store_converting_kernel");
    });
  });
}

}  // namespace troupe::cuda
