#pragma once
// The tensors a model_config implies (canonical HF names and shapes): the one list the loader
// checks a weight_store against and every backend takes its weights from, so that which biases,
// q/k norms and output projection a model has is decided in one place.

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.hpp"
#include "model/weight_store.hpp"

namespace troupe {

// Q/K/V biases: Qwen2 always has them, other architectures when the config says so.
bool has_attention_bias(const model_config& config);
// Per-head RMSNorm of q and k: Qwen3 always has it, other architectures when the config says so.
bool has_qk_norm(const model_config& config);

// The names of one decoder layer's tensors. Where the model has no such tensor the name is
// empty, and a backend must not look for it (a file may still hold one: it is ignored).
struct layer_tensor_names {
  std::string input_norm;           // [hidden]
  std::string q_proj;               // [num_heads * head_dim, hidden]
  std::string k_proj, v_proj;       // [num_kv_heads * head_dim, hidden]
  std::string q_bias;               // [num_heads * head_dim]; empty without attention bias
  std::string k_bias, v_bias;       // [num_kv_heads * head_dim]; empty without attention bias
  std::string q_norm, k_norm;       // [head_dim]; empty without q/k norm
  std::string o_proj;               // [hidden, num_heads * head_dim]
  std::string post_attention_norm;  // [hidden]
  std::string gate_proj, up_proj;   // [intermediate, hidden]
  std::string down_proj;            // [hidden, intermediate]
};

struct model_tensor_names {
  std::string embed_tokens;  // [vocab, hidden]
  std::vector<layer_tensor_names> layers;
  std::string final_norm;    // [hidden]
  // The output projection [vocab, hidden]: "lm_head.weight", or embed_tokens when the
  // embeddings are tied (then an lm_head.weight in the file is ignored, as transformers does).
  std::string lm_head;
};

model_tensor_names tensor_names(const model_config& config);

enum class tensor_role {
  matrix,     // a linear layer or embedding: [out, in]
  norm,       // an RMSNorm weight (initialized to 1)
  bias,       // an attention bias
};

struct tensor_spec {
  std::string name;
  std::vector<int64_t> shape;  // outermost first
  tensor_role role = tensor_role::matrix;
};

// Every tensor of tensor_names(config), each once, in a stable order: embeddings, then layer by
// layer, then the final norm and lm_head (lm_head only when the embeddings are not tied).
std::vector<tensor_spec> expected_tensors(const model_config& config);

// Throws std::runtime_error for the first missing tensor or wrong shape:
// "tensor X has shape [a,b], expected [c,d] from <source>".
void validate_weights(const model_config& config, const weight_store& weights, const std::string& source);

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace troupe
