#pragma once
// The tensors a model_config implies (canonical HF names and shapes), and the check that a
// loaded weight_store holds exactly those.

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.hpp"
#include "model/weight_store.hpp"

namespace troupe {

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

// In a stable order: embeddings, then layer by layer, then the final norm and lm_head
// (lm_head only when the embeddings are not tied).
std::vector<tensor_spec> expected_tensors(const model_config& config);

// Throws std::runtime_error for the first missing tensor or wrong shape:
// "tensor X has shape [a,b], expected [c,d] from <source>".
void validate_weights(const model_config& config, const weight_store& weights, const std::string& source);

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace troupe
