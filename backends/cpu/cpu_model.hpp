#pragma once
// The Llama family (llama, mistral, qwen2, qwen3; tied or untied embeddings; GQA) on the CPU
// backend, implementing model/model.hpp over a weight_store with HF canonical names.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "model/dtype.hpp"
#include "model/layer_range.hpp"
#include "model/model.hpp"
#include "model/model_config.hpp"
#include "model/weight_store.hpp"

namespace troupe {

// `weights` must outlive the model (it is viewed, not copied; only norm weights and biases are
// converted to f32 copies). num_threads <= 0: one per hardware thread. kv_dtype: the KV pool's
// element type (f32, f16, bf16, q8_0, fp8_e4m3). `layers`: a pipeline stage's layers (the
// default: all); the model then reads only that stage's tensors, pools KV for its layers only,
// and runs forward_batch's residual_in / residual_out as model/forward_batch.hpp says. Throws
// std::runtime_error naming the tensor or config field that does not fit (std::invalid_argument
// for a KV dtype that does not fit).
std::unique_ptr<model> make_cpu_model(const model_config& config, const weight_store& weights, kv_cache_shape kv_shape,
                                      int num_threads = 0, dtype kv_dtype = dtype::f16, layer_range layers = {});

// The weight store's tensors a model made by make_cpu_model copied into its repacked layout and
// never reads again (empty for any other model), for weight_store::release_copies.
std::vector<std::string> cpu_weights_not_read(const model& m);

// How many KV blocks of `block_size` tokens fit in `bytes` of the CPU backend's KV pool of
// `kv_dtype`, for the model or for a pipeline stage of `layers`.
int cpu_kv_blocks_for_budget(const model_config& config, size_t bytes, int block_size, dtype kv_dtype = dtype::f16,
                             layer_range layers = {});

}  // namespace troupe
