#pragma once
// What each part of a model takes on disk, read from its files' headers alone: the bytes of each
// decoder layer, of the token embedding, and of the output end (final norm and lm_head, or the
// embedding again when the head is tied to it). This is what split_layers_by_bytes
// (model/layer_range.hpp) balances when a topology cuts a model into pipeline stages by bytes,
// without loading the model or reading its weights.

#include <cstddef>
#include <filesystem>
#include <string_view>
#include <vector>

#include "model/layer_range.hpp"

namespace troupe {

struct model_part_bytes {
  std::vector<size_t> layers;  // [decoder layer]
  size_t embedding = 0;        // the first stage's besides its layers
  size_t head = 0;             // the last stage's besides its layers

  // The bytes a stage holding `range` (resolved) reads: its layers, and an end's if it has one.
  size_t bytes_of(const layer_range& range) const;
};

// The part bytes of the HF directory or GGUF file at `path` (as load_model takes it). Throws
// std::runtime_error naming the path when it is neither, or when it has no decoder layer or a
// layer with no tensor.
model_part_bytes read_model_part_bytes(const std::filesystem::path& path);

// Which part a tensor name (HF's "model.layers.3.mlp.up_proj.weight", GGUF's
// "blk.3.ffn_up.weight") belongs to: its decoder layer, or one of the ends.
struct tensor_part {
  enum kind_t { layer, embedding, head, other } kind = other;
  int layer_index = -1;
};
tensor_part part_of_tensor(std::string_view name);

}  // namespace troupe
