#pragma once
// NaN and infinite weights, found at load. A checkpoint written from a diverged run, or a file
// damaged on its way, loads and runs without them being noticed: every logit becomes NaN and the
// sampler answers token 0 forever. The float tensors (f32, f16, bf16) are scanned once, at the
// machine's full vector width (AVX-512 or AVX2, chosen at run time) and over several threads; the
// quantized types' scales are checked where their blocks are read (gguf_model_loader,
// int4_blocks), and FP8 weights' NaN codes by the checkpoint loader.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/weight_store.hpp"

namespace troupe {

// How a scan tests its elements: `scalar` is the portable loop (the compiler's baseline ISA), the
// reference every wider one must agree with.
enum class finiteness_scan_width { scalar, avx2, avx512 };

// The widths this CPU runs, narrowest first (scalar always).
std::vector<finiteness_scan_width> supported_finiteness_scan_widths();

// The index of the first element of `tensor` that is NaN or infinite (-inf allowed when
// `allow_negative_infinity`), if its type is a float type and it holds one; nullopt otherwise
// (quantized types are not scanned here). `width`: the widest this CPU runs unless given (tests
// compare them); a width the CPU lacks is refused with std::invalid_argument.
std::optional<int64_t> first_non_finite(const weight_tensor& tensor, bool allow_negative_infinity = false,
                                        std::optional<finiteness_scan_width> width = std::nullopt);

// Throws std::runtime_error naming the first tensor of `weights` (in name order) that holds a NaN or
// infinite value, its element (row and column) and `source`. Attention sinks (`*.sinks`) may be
// -inf: a sink that takes no weight. Big stores are scanned on up to `max_threads` threads (0:
// the machine's) at `width` (as first_non_finite); the answer is the same on any number and width.
void check_weights_finite(const weight_store& weights, const std::string& source, unsigned max_threads = 0,
                          std::optional<finiteness_scan_width> width = std::nullopt);

}  // namespace troupe
