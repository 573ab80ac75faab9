#include "model/weight_finiteness.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace troupe {

namespace {

// The first element whose exponent bits are all ones (NaN or infinity), scanning in chunks so
// the loop over a chunk is branch-free and vectorizes; only a chunk with a hit is searched again.
// `negative_infinity`: the bit pattern of -inf, allowed when not 0 (see first_non_finite).
template <typename Bits>
std::optional<int64_t> first_all_ones_exponent(const std::byte* data, int64_t count, Bits exponent_mask,
                                               Bits negative_infinity) {
  constexpr int64_t chunk = 4096;
  for (int64_t begin = 0; begin < count; begin += chunk) {
    const int64_t end = std::min(count, begin + chunk);
    Bits any = 0;
    for (int64_t i = begin; i < end; ++i) {
      Bits bits;
      std::memcpy(&bits, data + i * sizeof(Bits), sizeof(Bits));
      any |= static_cast<Bits>((bits & exponent_mask) == exponent_mask);
    }
    if (!any) continue;
    for (int64_t i = begin; i < end; ++i) {
      Bits bits;
      std::memcpy(&bits, data + i * sizeof(Bits), sizeof(Bits));
      if ((bits & exponent_mask) == exponent_mask && bits != negative_infinity) return i;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> first_non_finite(const weight_tensor& tensor, bool allow_negative_infinity) {
  const bool allow = allow_negative_infinity;
  switch (tensor.type) {
    case dtype::f32:
      return first_all_ones_exponent<uint32_t>(tensor.data, static_cast<int64_t>(tensor.num_bytes / 4), 0x7f800000u,
                                               allow ? 0xff800000u : 0u);
    case dtype::f16:
      return first_all_ones_exponent<uint16_t>(tensor.data, static_cast<int64_t>(tensor.num_bytes / 2), 0x7c00u,
                                               allow ? 0xfc00u : 0u);
    case dtype::bf16:
      return first_all_ones_exponent<uint16_t>(tensor.data, static_cast<int64_t>(tensor.num_bytes / 2), 0x7f80u,
                                               allow ? 0xff80u : 0u);
    default:
      return std::nullopt;
  }
}

void check_weights_finite(const weight_store& weights, const std::string& source) {
  for (const auto& [name, tensor] : weights.tensors()) {
    // An attention sink of -inf is a sink that takes no weight (exp(-inf) = 0): the model maker
    // writes them so for models without sinks. Any other non-finite value is damage.
    const bool sink = name.size() >= 6 && name.compare(name.size() - 6, 6, ".sinks") == 0;
    const std::optional<int64_t> bad = first_non_finite(tensor, sink);
    if (!bad) continue;
    const int64_t cols = tensor.cols();
    throw std::runtime_error("tensor " + name + " of " + source + " holds a NaN or infinite value at element " +
                             std::to_string(*bad) + " (row " + std::to_string(*bad / cols) + ", column " +
                             std::to_string(*bad % cols) +
                             "): the file is damaged or was written from a run that diverged");
  }
}

}  // namespace troupe
