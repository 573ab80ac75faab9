#include "model/loader/float_conversion.hpp"

#include <stdexcept>
#include <string>

#include "model/quant/dequantize.hpp"
#include "model/quant/quantize.hpp"

namespace troupe {

void convert_from_f32(std::span<const float> values, dtype type, std::byte* out) {
  const int64_t count = static_cast<int64_t>(values.size());
  if (count % dtype_block_size(type) != 0) {
    throw std::runtime_error(std::string(dtype_name(type)) + " needs a multiple of " +
                             std::to_string(dtype_block_size(type)) + " values, got " + std::to_string(count));
  }
  quant::quantize_row(type, values.data(), count, out);
}

void convert_to_f32(const std::byte* data, dtype type, std::span<float> out) {
  quant::dequantize_row(type, data, out.data(), static_cast<int64_t>(out.size()));
}

}  // namespace troupe
