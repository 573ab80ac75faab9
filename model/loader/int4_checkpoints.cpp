#include "model/loader/int4_checkpoints.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "model/model_tensors.hpp"

namespace troupe {
namespace {

// AWQ_ORDER: nibble k of an AWQ word holds output column 8·c + awq_column[k].
constexpr int awq_column[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// Rows (or columns) of a packed [in, out] matrix transposed together: a tile's codes stay in cache.
constexpr int64_t transpose_tile = 32;

[[noreturn]] void fail(const std::string& tensor, const std::string& problem) {
  throw std::runtime_error("tensor '" + tensor + "' " + problem);
}

const safetensors_tensor& need(const safetensors_checkpoint& checkpoint, const std::string& name,
                               const hf_quantization& q, const std::string& layout) {
  const safetensors_tensor* tensor = checkpoint.find(name);
  if (!tensor) fail(name, "is missing; " + q.method + " layers need " + layout);
  return *tensor;
}

void expect_type(const safetensors_tensor& tensor, bool integer, const std::string& what) {
  const bool is_i32 = tensor.type_name == "I32";
  if (integer ? !is_i32 : tensor.is_integer()) {
    fail(tensor.name, "is " + tensor.type_name + ", expected " + what);
  }
}

void expect_shape(const safetensors_tensor& tensor, const std::vector<int64_t>& shape, const std::string& meaning) {
  if (tensor.shape != shape) {
    fail(tensor.name,
         "has shape " + shape_string(tensor.shape) + ", expected " + shape_string(shape) + " (" + meaning + ")");
  }
}

void expect_2d(const safetensors_tensor& tensor, const std::string& meaning) {
  if (tensor.shape.size() != 2 || tensor.shape[0] <= 0 || tensor.shape[1] <= 0) {
    fail(tensor.name, "has shape " + shape_string(tensor.shape) + ", expected " + meaning);
  }
}

uint32_t word_at(const safetensors_tensor& tensor, int64_t i) {
  uint32_t word;
  std::memcpy(&word, tensor.data + 4 * i, 4);
  return word;
}

// The groups of columns when no g_idx says otherwise: runs of group_size (0: the whole row).
int64_t fill_sequential_groups(int4_layer& layer, int64_t group_size) {
  const int64_t g = group_size > 0 ? group_size : layer.cols;
  for (int64_t c = 0; c < layer.cols; ++c) layer.group[c] = static_cast<int32_t>(c / g);
  return (layer.cols + g - 1) / g;
}

// g_idx [cols] of integers in [0, num_groups).
void read_g_idx(int4_layer& layer, const safetensors_tensor& g_idx) {
  if (!g_idx.is_integer()) fail(g_idx.name, "is " + g_idx.type_name + ", expected an integer g_idx");
  expect_shape(g_idx, {layer.cols}, "one group index per input column");
  for (int64_t c = 0; c < layer.cols; ++c) {
    const int64_t g = g_idx.integer_at(c);
    if (g < 0 || g >= layer.num_groups) {
      fail(g_idx.name, "entry " + std::to_string(c) + " is " + std::to_string(g) + ", outside the " +
                           std::to_string(layer.num_groups) + " groups of the scales");
    }
    layer.group[c] = static_cast<int32_t>(g);
  }
}

// Each input column's group: from the g_idx tensor where the checkpoint has one, else in order of
// group_size columns (which must give the scales' number of groups). `act_order` names the
// setting that asks for a g_idx, for the error when it is missing.
void assign_groups(int4_layer& layer, const safetensors_checkpoint& checkpoint, const std::string& g_idx_name,
                   const hf_quantization& q, const std::string& act_order, const safetensors_tensor& scales) {
  if (const safetensors_tensor* g_idx = checkpoint.find(g_idx_name)) {
    read_g_idx(layer, *g_idx);
  } else if (q.act_order) {
    fail(g_idx_name,
         "is missing, but " + act_order + " in " + q.source + ": act-order needs each input column's group");
  } else {
    const int64_t expected = fill_sequential_groups(layer, q.group_size);
    if (expected != layer.num_groups) {
      fail(scales.name, "has " + std::to_string(layer.num_groups) + " groups, expected " + std::to_string(expected) +
                            " for group_size " + std::to_string(q.group_size) + " of " + std::to_string(layer.cols) +
                            " columns");
    }
  }
}

int4_layer empty_layer(const std::string& prefix, int64_t rows, int64_t cols, int64_t num_groups) {
  int4_layer layer;
  layer.name = prefix + ".weight";
  layer.rows = rows;
  layer.cols = cols;
  layer.num_groups = num_groups;
  layer.codes.resize(static_cast<size_t>(rows * cols));
  layer.zeros.resize(static_cast<size_t>(num_groups * rows));
  layer.scales.resize(static_cast<size_t>(num_groups * rows));
  layer.group.resize(static_cast<size_t>(cols));
  return layer;
}

}  // namespace

int4_layer read_awq_layer(const safetensors_checkpoint& checkpoint, const std::string& prefix,
                          const hf_quantization& q) {
  const std::string layout = "qweight [in, out/8], qzeros [in/group, out/8] and scales [in/group, out]";
  const safetensors_tensor& qweight = need(checkpoint, prefix + ".qweight", q, layout);
  const safetensors_tensor& qzeros = need(checkpoint, prefix + ".qzeros", q, layout);
  const safetensors_tensor& scales = need(checkpoint, prefix + ".scales", q, layout);
  expect_type(qweight, true, "I32 (AWQ's packed weights)");
  expect_type(qzeros, true, "I32 (AWQ's packed zeros)");
  expect_type(scales, false, "a float type (AWQ's scales)");
  expect_2d(scales, "[in_features / group_size, out_features] (AWQ)");
  const int64_t groups = scales.shape[0];
  const int64_t out = scales.shape[1];
  if (out % 8 != 0) fail(scales.name, "has " + std::to_string(out) + " output columns, expected a multiple of 8 (AWQ)");
  const int64_t words = out / 8;
  if (qweight.shape.size() != 2 || qweight.shape[1] != words || qweight.shape[0] <= 0) {
    fail(qweight.name, "has shape " + shape_string(qweight.shape) + ", expected [in_features, " +
                           std::to_string(words) + "] (AWQ; " + std::to_string(out) + " output columns as in " +
                           scales.name + ")");
  }
  const int64_t in = qweight.shape[0];
  const int64_t group = q.group_size > 0 ? q.group_size : in;
  if (in != groups * group) {
    fail(qweight.name, "has " + std::to_string(in) + " input rows, expected " + std::to_string(groups) + " groups of " +
                           std::to_string(group) + " (" + scales.name + " " + shape_string(scales.shape) +
                           ", group_size from " + q.source + ")");
  }
  expect_shape(qzeros, {groups, words}, "[in_features / group_size, out_features / 8] (AWQ)");

  int4_layer layer = empty_layer(prefix, out, in, groups);
  // A transposition: input rows a tile at a time, so each output row is written in runs.
  for (int64_t i0 = 0; i0 < in; i0 += transpose_tile) {
    const int64_t i1 = std::min(in, i0 + transpose_tile);
    for (int64_t c = 0; c < words; ++c) {
      for (int64_t i = i0; i < i1; ++i) {
        const uint32_t word = word_at(qweight, i * words + c);
        for (int k = 0; k < 8; ++k) layer.codes[(8 * c + awq_column[k]) * in + i] = (word >> (4 * k)) & 15;
      }
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t c = 0; c < words; ++c) {
      const uint32_t word = word_at(qzeros, g * words + c);
      for (int k = 0; k < 8; ++k) layer.zeros[g * out + 8 * c + awq_column[k]] = (word >> (4 * k)) & 15;
    }
    for (int64_t o = 0; o < out; ++o) layer.scales[g * out + o] = scales.float_at(g * out + o);
  }
  fill_sequential_groups(layer, group);
  return layer;
}

int4_layer read_gptq_layer(const safetensors_checkpoint& checkpoint, const std::string& prefix,
                           const hf_quantization& q) {
  const std::string layout = "qweight [in/8, out], qzeros [groups, out/8], scales [groups, out] and g_idx [in]";
  const safetensors_tensor& qweight = need(checkpoint, prefix + ".qweight", q, layout);
  const safetensors_tensor& qzeros = need(checkpoint, prefix + ".qzeros", q, layout);
  const safetensors_tensor& scales = need(checkpoint, prefix + ".scales", q, layout);
  expect_type(qweight, true, "I32 (GPTQ's packed weights)");
  expect_type(qzeros, true, "I32 (GPTQ's packed zeros)");
  expect_type(scales, false, "a float type (GPTQ's scales)");
  expect_2d(scales, "[groups, out_features] (GPTQ)");
  const int64_t groups = scales.shape[0];
  const int64_t out = scales.shape[1];
  if (out % 8 != 0)
    fail(scales.name, "has " + std::to_string(out) + " output columns, expected a multiple of 8 (GPTQ)");
  if (qweight.shape.size() != 2 || qweight.shape[1] != out || qweight.shape[0] <= 0) {
    fail(qweight.name, "has shape " + shape_string(qweight.shape) + ", expected [in_features / 8, " +
                           std::to_string(out) + "] (GPTQ; " + std::to_string(out) + " output columns as in " +
                           scales.name + ")");
  }
  const int64_t in = qweight.shape[0] * 8;
  expect_shape(qzeros, {groups, out / 8}, "[groups, out_features / 8] (GPTQ)");

  int4_layer layer = empty_layer(prefix, out, in, groups);
  // A transposition: output columns a tile at a time, so each output row is written in runs.
  for (int64_t o0 = 0; o0 < out; o0 += transpose_tile) {
    const int64_t o1 = std::min(out, o0 + transpose_tile);
    for (int64_t w = 0; w < in / 8; ++w) {
      for (int64_t o = o0; o < o1; ++o) {
        const uint32_t word = word_at(qweight, w * out + o);
        for (int k = 0; k < 8; ++k) layer.codes[o * in + 8 * w + k] = (word >> (4 * k)) & 15;
      }
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t c = 0; c < out / 8; ++c) {
      uint32_t word = word_at(qzeros, g * (out / 8) + c);
      if (q.zeros_minus_one) word += 0x11111111u;  // undoes v1's word-wide subtraction, borrows included
      for (int k = 0; k < 8; ++k) layer.zeros[g * out + 8 * c + k] = (word >> (4 * k)) & 15;
    }
    for (int64_t o = 0; o < out; ++o) layer.scales[g * out + o] = scales.float_at(g * out + o);
  }
  assign_groups(layer, checkpoint, prefix + ".g_idx", q, "desc_act is true", scales);
  return layer;
}

int4_layer read_packed_int4_layer(const safetensors_checkpoint& checkpoint, const std::string& prefix,
                                  const hf_quantization& q) {
  const std::string layout = "weight_packed [out, in/8] and weight_scale [out, groups]";
  const safetensors_tensor& packed = need(checkpoint, prefix + ".weight_packed", q, layout);
  const safetensors_tensor& scales = need(checkpoint, prefix + ".weight_scale", q, layout);
  expect_type(packed, true, "I32 (compressed-tensors' packed weights)");
  expect_type(scales, false, "a float type (compressed-tensors' scales)");
  expect_2d(packed, "[out_features, in_features / 8] (compressed-tensors pack-quantized)");
  expect_2d(scales, "[out_features, groups] (compressed-tensors pack-quantized)");
  const int64_t out = packed.shape[0];
  const int64_t words = packed.shape[1];
  int64_t in = words * 8;
  if (const safetensors_tensor* shape = checkpoint.find(prefix + ".weight_shape")) {
    if (!shape->is_integer() || shape->num_elements() != 2 || shape->integer_at(0) != out ||
        shape->integer_at(1) <= (words - 1) * 8 || shape->integer_at(1) > in) {
      fail(shape->name,
           "must hold [out_features, in_features] matching " + packed.name + " " + shape_string(packed.shape));
    }
    in = shape->integer_at(1);
  }
  const int64_t groups = scales.shape[1];
  expect_shape(scales, {out, groups}, "[out_features, groups] (compressed-tensors pack-quantized)");

  int4_layer layer = empty_layer(prefix, out, in, groups);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t c = 0; c < words; ++c) {
      const uint32_t word = word_at(packed, o * words + c);
      for (int k = 0; k < 8 && 8 * c + k < in; ++k) layer.codes[o * in + 8 * c + k] = (word >> (4 * k)) & 15;
    }
  }
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t g = 0; g < groups; ++g) layer.scales[g * out + o] = scales.float_at(o * groups + g);
  }
  if (const safetensors_tensor* zero_point = checkpoint.find(prefix + ".weight_zero_point")) {
    if (zero_point->type_name == "I32") {  // packed along the output dimension, value + 8
      expect_shape(*zero_point, {(out + 7) / 8, groups}, "[out_features / 8, groups], packed zero points");
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t g = 0; g < groups; ++g) {
          layer.zeros[g * out + o] = (word_at(*zero_point, (o / 8) * groups + g) >> (4 * (o % 8))) & 15;
        }
      }
    } else if (zero_point->type_name == "I8") {  // unpacked signed zero points
      expect_shape(*zero_point, {out, groups}, "[out_features, groups], int8 zero points");
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t zero = zero_point->integer_at(o * groups + g);
          if (zero < -8 || zero > 7)
            fail(zero_point->name, "holds " + std::to_string(zero) + ", outside int4's [-8, 7]");
          layer.zeros[g * out + o] = static_cast<uint8_t>(zero + 8);
        }
      }
    } else {
      fail(zero_point->name, "is " + zero_point->type_name + ", expected I32 (packed) or I8 zero points");
    }
  } else {
    std::fill(layer.zeros.begin(), layer.zeros.end(), uint8_t{8});  // symmetric: zero 0, stored offset by 8
  }
  assign_groups(layer, checkpoint, prefix + ".weight_g_idx", q, "actorder is \"group\"", scales);
  return layer;
}

}  // namespace troupe
