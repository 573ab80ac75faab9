#include "model/loader/model_part_bytes.hpp"

#include <charconv>
#include <stdexcept>
#include <string>
#include <utility>

#include "model/loader/gguf_file.hpp"
#include "model/loader/model_loader.hpp"
#include "model/loader/safetensors_file.hpp"

namespace troupe {

namespace {

// The layer number after `prefix` at the start of `name` ("blk.12.attn_q.weight" with "blk."),
// or -1.
int layer_after(std::string_view name, std::string_view prefix) {
  if (name.substr(0, prefix.size()) != prefix) return -1;
  const std::string_view rest = name.substr(prefix.size());
  int layer = -1;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
  if (error != std::errc() || end == rest.data() || end == rest.data() + rest.size() || *end != '.') return -1;
  return layer;
}

}  // namespace

tensor_part part_of_tensor(std::string_view name) {
  for (std::string_view prefix : {"model.layers.", "blk."}) {
    if (const int layer = layer_after(name, prefix); layer >= 0) return {tensor_part::layer, layer};
  }
  if (name == "model.embed_tokens.weight" || name == "token_embd.weight") return {tensor_part::embedding};
  if (name == "lm_head.weight" || name == "model.norm.weight" || name == "output.weight" ||
      name == "output_norm.weight") {
    return {tensor_part::head};
  }
  return {};
}

size_t model_part_bytes::bytes_of(const layer_range& range) const {
  size_t bytes = 0;
  for (int layer = range.first; layer < range.end; ++layer) bytes += layers.at(static_cast<size_t>(layer));
  if (range.holds_embedding()) bytes += embedding;
  if (range.holds_head(static_cast<int>(layers.size()))) bytes += head;
  return bytes;
}

model_part_bytes read_model_part_bytes(const std::filesystem::path& path) {
  std::vector<std::pair<std::string, size_t>> tensors;
  if (detect_format(path) == load_format::gguf) {
    const gguf_file file = gguf_file::open(path);
    for (const gguf_tensor_info& t : file.tensors()) tensors.emplace_back(t.name, t.num_bytes);
  } else {
    const safetensors_checkpoint checkpoint = read_safetensors_directory(path);
    for (const safetensors_tensor& t : checkpoint.tensors) tensors.emplace_back(t.name, t.num_bytes);
  }
  model_part_bytes parts;
  std::vector<bool> seen;
  bool has_output = false;
  for (const auto& [name, bytes] : tensors) {
    const tensor_part part = part_of_tensor(name);
    switch (part.kind) {
      case tensor_part::layer: {
        const size_t index = static_cast<size_t>(part.layer_index);
        // A layer number from the file: the model's own count is checked when it loads.
        if (index >= 4096) {
          throw std::runtime_error("'" + path.string() + "': tensor " + name + " names layer " + std::to_string(index) +
                                   ", past any model's layers");
        }
        if (index >= parts.layers.size()) {
          parts.layers.resize(index + 1, 0);
          seen.resize(index + 1, false);
        }
        parts.layers[index] += bytes;
        seen[index] = true;
        break;
      }
      case tensor_part::embedding: parts.embedding += bytes; break;
      case tensor_part::head:
        parts.head += bytes;
        has_output = has_output || name == "lm_head.weight" || name == "output.weight";
        break;
      case tensor_part::other: break;
    }
  }
  if (parts.layers.empty()) throw std::runtime_error("'" + path.string() + "' has no decoder layer's tensors");
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) throw std::runtime_error("'" + path.string() + "' has no tensor of layer " + std::to_string(i));
  }
  // A tied head is the embedding: the last stage reads it too.
  if (!has_output) parts.head += parts.embedding;
  return parts;
}

}  // namespace troupe
