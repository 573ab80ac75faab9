#pragma once
// Sampling on the GPU, one block per row of logits.
//
// Greedy is an argmax (first index on ties, as torch.argmax). Random sampling never sorts: the
// top-k and top-p cut-offs are probability thresholds found by bisection (each step one pass
// over the row and one block reduction), then a block-wide prefix sum over the kept
// probabilities, in vocabulary order, finds where seed-determined u * kept_mass falls.
//
// A row may carry a token mask (structured output): a refused token is treated as logit -inf
// everywhere (argmax skips it, its probability is 0), which is what the host sampler does.

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "backends/cuda/cuda_types.cuh"
#include "backends/cuda/ops.hpp"

namespace troupe::cuda {

inline constexpr int sampling_threads = 1024;

__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// 53 random bits of (seed, offset) as a double in [0, 1).
__host__ __device__ inline double uniform_from(uint64_t seed, uint64_t offset) {
  const uint64_t bits = splitmix64(seed ^ splitmix64(offset));
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

struct max_op {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct arg_best {
  float value;
  int index;
};

__device__ __forceinline__ arg_best better(arg_best a, arg_best b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// Whether `mask` ([mask_words], bit t = token t allowed; nullptr = no mask) allows token i.
__device__ __forceinline__ bool allowed_by(const uint64_t* __restrict__ mask, int mask_words, int i) {
  if (mask == nullptr) return true;
  const int word = i >> 6;
  return word < mask_words && ((mask[word] >> (i & 63)) & 1ull) != 0;
}

// Block-wide argmax of row[0..vocab) over the tokens `mask` allows; every thread gets the result.
// Unmasked, an all-NaN row gives 0; masked, a row with no allowed (non-NaN) token gives -1, so
// that a refused token is never returned.
__device__ inline int block_argmax(const float* row, int vocab, const uint64_t* mask = nullptr, int mask_words = 0) {
  __shared__ arg_best warp_best[32];
  arg_best best{-INFINITY, vocab};
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (allowed_by(mask, mask_words, i)) best = better(best, arg_best{row[i], i});
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    arg_best other{__shfl_xor_sync(0xffffffffu, best.value, offset), __shfl_xor_sync(0xffffffffu, best.index, offset)};
    best = better(best, other);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = lane < static_cast<int>(blockDim.x / 32) ? warp_best[lane] : arg_best{-INFINITY, vocab};
    for (int offset = 16; offset > 0; offset >>= 1) {
      arg_best other{__shfl_xor_sync(0xffffffffu, best.value, offset),
                     __shfl_xor_sync(0xffffffffu, best.index, offset)};
      best = better(best, other);
    }
    if (lane == 0) warp_best[0] = best;
  }
  __syncthreads();
  const int index = warp_best[0].index;
  __syncthreads();
  if (index < vocab) return index;
  return mask == nullptr ? 0 : -1;  // never run off the end, never pick a refused token
}

// logits [rows, vocab], out [rows]
__global__ void __launch_bounds__(sampling_threads)
    argmax_kernel(const float* __restrict__ logits, int vocab, int32_t* __restrict__ out) {
  const int index = block_argmax(logits + static_cast<int64_t>(blockIdx.x) * vocab, vocab);
  if (threadIdx.x == 0) out[blockIdx.x] = index;
}

// logits [rows, vocab], params [rows], masks [num_masks, mask_words] (rows with mask_row >= 0), out [rows]
__global__ void __launch_bounds__(sampling_threads)
    sample_kernel(const float* __restrict__ logits, int vocab, const sampling_row* __restrict__ params,
                  const uint64_t* __restrict__ masks, int mask_words, int32_t* __restrict__ out) {
  using reduce_t = cub::BlockReduce<float, sampling_threads>;
  using scan_t = cub::BlockScan<float, sampling_threads>;
  __shared__ union {
    typename reduce_t::TempStorage reduce;
    typename scan_t::TempStorage scan;
  } temp;
  __shared__ float broadcast;
  __shared__ int found;

  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const sampling_row param = params[blockIdx.x];
  const uint64_t* mask =
      param.mask_row >= 0 && masks != nullptr ? masks + static_cast<int64_t>(param.mask_row) * mask_words : nullptr;
  if (param.temperature <= 0.0f || param.top_k == 1) {
    const int index = block_argmax(row, vocab, mask, mask_words);
    if (threadIdx.x == 0) out[blockIdx.x] = index;
    return;
  }

  // Block reductions that hand the result to every thread.
  auto block_sum = [&](float value) {
    const float total = reduce_t(temp.reduce).Sum(value);
    if (threadIdx.x == 0) broadcast = total;
    __syncthreads();
    const float result = broadcast;
    __syncthreads();
    return result;
  };
  auto block_max = [&](float value) {
    const float best = reduce_t(temp.reduce).Reduce(value, max_op{});
    if (threadIdx.x == 0) broadcast = best;
    __syncthreads();
    const float result = broadcast;
    __syncthreads();
    return result;
  };

  float local_max = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (allowed_by(mask, mask_words, i)) local_max = fmaxf(local_max, row[i]);
  }
  const float row_max = block_max(local_max);
  if (mask != nullptr && !(row_max > -INFINITY)) {
    // Nothing allowed has a finite logit: no distribution to draw from. The argmax gives the
    // lowest allowed id (all -inf), or -1 when the mask allows nothing.
    const int index = block_argmax(row, vocab, mask, mask_words);
    if (threadIdx.x == 0) out[blockIdx.x] = index;
    return;
  }
  const float inv_temperature = 1.0f / param.temperature;
  // Unnormalized probabilities in (0, 1]: the largest allowed is exactly 1, a refused token 0.
  auto prob = [&](int i) {
    return allowed_by(mask, mask_words, i) ? __expf((row[i] - row_max) * inv_temperature) : 0.0f;
  };
  auto mass_at_least = [&](float threshold, bool count) {
    float local = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float p = prob(i);
      if (p >= threshold) local += count ? 1.0f : p;
    }
    return block_sum(local);
  };

  float threshold = 0.0f;
  if (param.top_k > 0 && param.top_k < vocab) {
    float low = 0.0f, high = 1.0f;  // count(p >= low) >= k > count(p >= high) once high moved
    for (int step = 0; step < 32; ++step) {
      const float mid = 0.5f * (low + high);
      if (mass_at_least(mid, true) >= static_cast<float>(param.top_k))
        low = mid;
      else
        high = mid;
    }
    threshold = low;
  }
  if (param.top_p < 1.0f) {
    const float target = param.top_p * mass_at_least(threshold, false);
    float low = threshold, high = 1.0f;  // mass(p >= low) >= target
    for (int step = 0; step < 32; ++step) {
      const float mid = 0.5f * (low + high);
      if (mass_at_least(mid, false) >= target)
        low = mid;
      else
        high = mid;
    }
    threshold = low;
  }
  const float kept_mass = mass_at_least(threshold, false);
  const float target = static_cast<float>(uniform_from(param.seed, param.offset)) * kept_mass;

  if (threadIdx.x == 0) found = -1;
  __syncthreads();
  float running = 0.0f;
  int last_kept = -1;
  for (int base = 0; base < vocab; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const float p = i < vocab ? prob(i) : 0.0f;
    const float kept = p >= threshold ? p : 0.0f;
    if (kept > 0.0f) last_kept = i;
    float inclusive, aggregate;
    scan_t(temp.scan).InclusiveSum(kept, inclusive, aggregate);
    if (kept > 0.0f && running + inclusive - kept <= target && target < running + inclusive) found = i;
    __syncthreads();
    if (found >= 0) break;
    running += aggregate;
  }
  if (found < 0) {  // rounding left target at the very end of the kept mass: take the last kept token
    const float last = reduce_t(temp.reduce).Reduce(static_cast<float>(last_kept), max_op{});
    if (threadIdx.x == 0) found = static_cast<int>(last);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = found;
}

}  // namespace troupe::cuda
