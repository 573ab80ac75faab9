#pragma once
// NaN and infinite weights, found at load. A checkpoint written from a diverged run, or a file
// damaged on its way, loads and runs without them being noticed: every logit becomes NaN and the
// sampler answers token 0 forever. The float tensors (f32, f16, bf16) are scanned once, at
// memory speed; the quantized types' scales are checked where their blocks are read, and FP8
// weights' NaN codes by the checkpoint loader.

#include <cstdint>
#include <optional>
#include <string>

#include "model/weight_store.hpp"

namespace troupe {

// The index of the first element of `tensor` that is NaN or infinite (-inf allowed when
// `allow_negative_infinity`), if its type is a float type and it holds one; nullopt otherwise
// (quantized types are not scanned here).
std::optional<int64_t> first_non_finite(const weight_tensor& tensor, bool allow_negative_infinity = false);

// Throws std::runtime_error naming the first tensor of `weights` (in name order) that holds a NaN or
// infinite value, its element (row and column) and `source`. Attention sinks (`*.sinks`) may be
// -inf: a sink that takes no weight.
void check_weights_finite(const weight_store& weights, const std::string& source);

}  // namespace troupe
