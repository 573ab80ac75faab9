#pragma once
// A Llama-family model's weights on one CUDA device, uploaded once at load: the linear layers'
// weights in their stored block types (q4_k, q8_0, ... read in place by the quantized kernels;
// other types converted to the activation dtype: cuda::linear_weight), norms and biases in the
// activation dtype. The forward (backends/cuda/cuda_model.cpp) only reads them.

#include <map>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backends/cuda/device_buffer.hpp"
#include "backends/cuda/linear_weight.hpp"
#include "model/dtype.hpp"
#include "model/model_config.hpp"
#include "model/weight_store.hpp"

namespace troupe::cuda {

struct layer_weights {
  linear_weight qkv;             // [(num_heads + 2 * num_kv_heads) * head_dim, hidden]
  device_buffer qkv_bias;        // [(num_heads + 2 * num_kv_heads) * head_dim] (Qwen2) or empty
  linear_weight o;               // [hidden, num_heads * head_dim]
  linear_weight gate_up;         // [2 * intermediate, hidden]
  linear_weight down;            // [hidden, intermediate]
  device_buffer input_norm;      // [hidden]
  device_buffer post_attn_norm;  // [hidden]
  device_buffer q_norm;          // [head_dim] (Qwen3) or empty
  device_buffer k_norm;          // [head_dim] (Qwen3) or empty
};

class model_weights {
 public:
  // Uploads every tensor the config's architecture names (model/model_tensors.hpp) on `stream`,
  // the current device's. Throws std::runtime_error naming a missing or misshapen tensor.
  model_weights(const model_config& config, const weight_store& weights, dtype activation, cudaStream_t stream);

  const linear_weight& embed_tokens() const { return embed_; }
  const linear_weight& lm_head() const { return lm_head_; }  // embed_tokens' storage when tied
  const device_buffer& final_norm() const { return final_norm_; }
  const layer_weights& layer(int index) const { return layers_[index]; }

  // Embedding rows for `n` token ids into out [n, hidden] on `stream`: gathered, or dequantized
  // from a quantized table.
  void embed(const int32_t* ids, void* out, int n, cudaStream_t stream) const;

  // The dequantization scratch one stream's linear layers need (cuda::linear): a slice of at most
  // `cap` bytes of the largest quantized weight; 0 when every weight is plain.
  size_t dequantize_scratch_bytes(size_t cap) const;

  size_t bytes() const { return bytes_; }  // device memory they take (quantized ones as stored)
  // "q4_k: 97, f32->bf16: 65": how many tensors went up in which type.
  std::string tensor_counts() const;

 private:
  device_buffer upload(const std::vector<const weight_tensor*>& parts, device_buffer& staging, cudaStream_t stream);
  linear_weight upload_linear(const std::vector<const weight_tensor*>& parts, device_buffer& staging,
                              cudaStream_t stream);
  void count_tensor(const weight_tensor& tensor, dtype on_device);

  model_config config_;
  dtype activation_;
  linear_weight embed_;       // [vocab, hidden]
  linear_weight lm_head_;     // [vocab, hidden]
  device_buffer final_norm_;  // [hidden]
  std::vector<layer_weights> layers_;
  size_t bytes_ = 0;
  std::map<std::string, int> tensor_counts_;
};

}  // namespace troupe::cuda
