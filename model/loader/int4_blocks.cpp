#include "model/loader/int4_blocks.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>

#include "model/quant/block_fields.hpp"

namespace troupe {
namespace {

constexpr int64_t block = 32;  // q4_0 / q4_1 elements per block
constexpr float f16_max = 65504.0f;

[[noreturn]] void fail(const int4_layer& layer, const std::string& problem) {
  throw std::runtime_error("tensor '" + layer.name + "': " + problem);
}

// True when every run of 32 columns of `order` lies in one group.
bool blocks_share_groups(const int4_layer& layer, const std::vector<int32_t>& order) {
  for (int64_t first = 0; first < layer.cols; first += block) {
    const int32_t g = layer.group[order[first]];
    for (int64_t j = 1; j < block; ++j) {
      if (layer.group[order[first + j]] != g) return false;
    }
  }
  return true;
}

void check_layer(const int4_layer& layer) {
  const auto rows = static_cast<size_t>(layer.rows);
  const auto cols = static_cast<size_t>(layer.cols);
  const auto groups = static_cast<size_t>(layer.num_groups);
  if (layer.codes.size() != rows * cols || layer.zeros.size() != groups * rows ||
      layer.scales.size() != groups * rows || layer.group.size() != cols) {
    fail(layer, "unpacked sizes do not match its shape (an unpacker bug)");
  }
  if (layer.cols % block != 0) {
    fail(layer, "in_features " + std::to_string(layer.cols) + " is not a multiple of 32, which 4-bit blocks need");
  }
  for (int64_t c = 0; c < layer.cols; ++c) {
    if (layer.group[c] < 0 || layer.group[c] >= layer.num_groups) {
      fail(layer, "column " + std::to_string(c) + " is in group " + std::to_string(layer.group[c]) + " of " +
                      std::to_string(layer.num_groups));
    }
  }
  for (int64_t g = 0; g < layer.num_groups; ++g) {
    for (int64_t r = 0; r < layer.rows; ++r) {
      const float scale = layer.scales[g * layer.rows + r];
      if (!std::isfinite(scale)) {
        fail(layer, "scale of group " + std::to_string(g) + ", row " + std::to_string(r) + " is " +
                        std::to_string(scale) + " (NaN or infinite)");
      }
      if (std::fabs(scale) > f16_max || std::fabs(scale * layer.zeros[g * layer.rows + r]) > f16_max) {
        fail(layer, "scale of group " + std::to_string(g) + ", row " + std::to_string(r) + " (" +
                        std::to_string(scale) + ") does not fit the f16 of a 4-bit block");
      }
    }
  }
}

}  // namespace

double int4_layer::value(int64_t row, int64_t col) const {
  const int64_t g = group[col];
  return static_cast<double>(scales[g * rows + row]) *
         (static_cast<int>(codes[row * cols + col]) - zeros[g * rows + row]);
}

unpacked_weight repack_int4(const int4_layer& layer) {
  check_layer(layer);
  std::vector<int32_t> order(static_cast<size_t>(layer.cols));  // stored column j holds column order[j]
  std::iota(order.begin(), order.end(), 0);
  const bool natural = blocks_share_groups(layer, order);
  if (!natural) {
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return layer.group[a] < layer.group[b]; });
    if (!blocks_share_groups(layer, order)) {
      fail(layer,
           "its g_idx gives a group a number of columns that is not a multiple of 32, so no order of the "
           "columns cuts the groups into 4-bit blocks");
    }
  }
  const bool symmetric = std::all_of(layer.zeros.begin(), layer.zeros.end(), [](uint8_t z) { return z == 8; });
  const dtype type = symmetric ? dtype::q4_0 : dtype::q4_1;
  const size_t block_bytes = dtype_traits_of(type).block_bytes;
  const size_t stride = row_bytes(type, layer.cols);
  auto buffer =
      std::make_shared<std::vector<std::byte>>(stride * static_cast<size_t>(layer.rows));  // [rows, cols/32 blocks]
  for (int64_t r = 0; r < layer.rows; ++r) {
    const uint8_t* codes = layer.codes.data() + r * layer.cols;  // [cols]
    for (int64_t b = 0; b < layer.cols / block; ++b) {
      const int32_t* columns = order.data() + b * block;  // the block's 32 source columns
      const int64_t g = layer.group[columns[0]];
      const float scale = layer.scales[g * layer.rows + r];
      const uint8_t zero = layer.zeros[g * layer.rows + r];
      std::byte* out = buffer->data() + r * stride + b * block_bytes;
      quant::write_f16(out, scale);
      std::byte* qs = out + 2;
      if (type == dtype::q4_1) {
        quant::write_f16(out + 2, -static_cast<float>(zero) * scale);
        qs = out + 4;
      }
      // Element j in the low nibble of byte j, element j + 16 in its high nibble (ggml's order).
      for (int64_t j = 0; j < block / 2; ++j) {
        qs[j] = static_cast<std::byte>(codes[columns[j]] | (codes[columns[j + block / 2]] << 4));
      }
    }
  }
  weight_tensor tensor;
  tensor.name = layer.name;
  tensor.type = type;
  tensor.shape = {layer.rows, layer.cols};
  tensor.data = buffer->data();
  tensor.num_bytes = buffer->size();
  if (!natural) tensor.input_order = std::move(order);
  return {std::move(tensor), std::move(buffer)};
}

}  // namespace troupe
