#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/sampling.cuh"

namespace troupe::cuda {

void argmax(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_kernel<<<rows, sampling_threads, 0, stream>>>(logits, vocab, out);
  check_launch("argmax_kernel");
}

void sample(const float* logits, int rows, int vocab, const sampling_row* params, int32_t* out, cudaStream_t stream) {
  sample(logits, rows, vocab, params, nullptr, 0, out, stream);
}

void sample(const float* logits, int rows, int vocab, const sampling_row* params, const uint64_t* masks, int mask_words,
            int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  sample_kernel<<<rows, sampling_threads, 0, stream>>>(logits, vocab, params, masks, mask_words, out);
  check_launch("sample_kernel");
}

double sampling_uniform(uint64_t seed, uint64_t offset) { return uniform_from(seed, offset); }

}  // namespace troupe::cuda
