#pragma once
// The layers one pipeline stage of a model holds: a contiguous range [first, end) of the decoder
// layers. The first stage also holds the token embedding, the last the final norm and the output
// projection (lm_head, or the embedding when tied); a stage in between holds layers only. A model
// on one node is the one stage that holds every layer.
//
// Between stages travels the residual stream: the hidden state of every token of the step as it
// leaves the stage's last layer, before any final norm (forward_batch::residual_in / residual_out).

#include <string>
#include <string_view>
#include <vector>

namespace troupe {

struct layer_range {
  int first = 0;
  int end = 0;  // one past the last layer; 0: up to the model's last layer (the default: all of them)

  // The whole model of `num_layers` layers.
  static layer_range all(int num_layers) { return {0, num_layers}; }
  // [first, end) resolved against the model: end 0 stands for "to the last layer", so the
  // default is every layer and {k, 0} the last stage from layer k on.
  layer_range resolved(int num_layers) const { return end == 0 ? layer_range{first, num_layers} : *this; }

  int count() const { return end - first; }
  bool holds(int layer) const { return layer >= first && layer < end; }
  bool holds_embedding() const { return first == 0; }
  bool holds_head(int num_layers) const { return end == num_layers; }
  bool whole(int num_layers) const { return first == 0 && end == num_layers; }
  bool operator==(const layer_range&) const = default;
};

// "0-15" (both ends inclusive, as topology files write it) or "7" (one layer) of a model of
// `num_layers` layers. Throws std::runtime_error naming the text and what is wrong (not a range,
// reversed, past the model's last layer).
layer_range parse_layer_range(std::string_view text, int num_layers);
// "0-15", the form parse_layer_range reads.
std::string layer_range_text(const layer_range& range);

// Throws std::runtime_error unless `range` is a non-empty range of the model's layers.
void check_layer_range(const layer_range& range, int num_layers);

// Throws std::runtime_error unless `ranges` cover layers 0 .. num_layers - 1 once each, in order
// (a pipeline's stages): names the gap or overlap.
void check_pipeline_ranges(const std::vector<layer_range>& ranges, int num_layers);

// Splits the layers into `num_stages` contiguous ranges whose largest (in bytes) is as small as it
// can be, given each layer's
// bytes and what the first stage (embedding) and the last (final norm, lm_head) hold besides
// (a tied lm_head is the embedding: the last stage then reads it too, count it there as well).
// Every stage gets at least one layer. Throws std::runtime_error when num_stages is not in
// 1 .. layer_bytes.size().
std::vector<layer_range> split_layers_by_bytes(const std::vector<size_t>& layer_bytes, size_t first_stage_extra,
                                               size_t last_stage_extra, int num_stages);
// The same for stages of unequal room (a node's memory for weights): the split whose fullest
// stage, its bytes over capacities[stage], is least full; one stage per capacity. Throws as above,
// or when a capacity is not positive.
std::vector<layer_range> split_layers_by_capacity(const std::vector<size_t>& layer_bytes, size_t first_stage_extra,
                                                  size_t last_stage_extra, const std::vector<double>& capacities);

}  // namespace troupe
