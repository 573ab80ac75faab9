#pragma once
// Hugging Face checkpoints that store some tensors in another form than the canonical one
// (model/model_tensors.hpp), both directions:
// - Phi-3: self_attn.qkv_proj [q + k + v, hidden] and mlp.gate_up_proj [2 * intermediate, hidden]
//   (gate first): the canonical q/k/v_proj and gate/up_proj are row slices of them (views, no copy);
// - gpt-oss: mlp.router -> the canonical router; the experts of a layer packed as
//   mlp.experts.gate_up_proj [experts, hidden, 2 * intermediate] with gate and up interleaved
//   (gate in even columns), gate_up_proj_bias [experts, 2 * intermediate],
//   down_proj [experts, intermediate, hidden], down_proj_bias [experts, hidden] (transformers'
//   GptOssExperts parameters, as a BF16 or F32 checkpoint holds them): transposed and
//   de-interleaved into per-expert [out, in] matrices at load (owned copies, f32).

#include <functional>
#include <string>
#include <vector>

#include "model/model_config.hpp"
#include "model/model_tensors.hpp"
#include "model/weight_store.hpp"

namespace troupe {

// Adds the canonical tensors of the checkpoint tensors in `store` (named as in the files).
// Throws naming a checkpoint tensor that is missing or of the wrong shape.
void adapt_hf_tensors(const model_config& config, weight_store& store);

// One tensor of an HF checkpoint, as f32 values, for the model maker.
struct hf_checkpoint_tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The checkpoint tensors that hold `config`'s canonical tensors, in a stable order, from each
// canonical tensor's values (`values_of`).
std::vector<hf_checkpoint_tensor> hf_checkpoint_tensors(
    const model_config& config, const std::function<std::vector<float>(const tensor_spec&)>& values_of);

}  // namespace troupe
