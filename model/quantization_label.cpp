#include "model/quantization_label.hpp"

#include <algorithm>
#include <vector>

#include "model/quant/quantize_presets.hpp"

namespace troupe {

std::string ggml_style_name(dtype type) {
  std::string name(dtype_name(type));
  // ggml capitalises the K of the k-quants: q4_K.
  if (name.size() == 4 && name[0] == 'q' && name[3] == 'k') name[3] = 'K';
  return name;
}

std::map<dtype, int> tensor_type_counts(const weight_store& weights) {
  std::map<dtype, int> counts;
  for (const auto& [name, tensor] : weights.tensors()) ++counts[tensor.type];
  return counts;
}

std::string describe_type_counts(const std::map<dtype, int>& counts) {
  std::vector<std::pair<dtype, int>> sorted(counts.begin(), counts.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string text;
  for (const auto& [type, count] : sorted) {
    text += (text.empty() ? "" : ", ") + ggml_style_name(type) + ": " + std::to_string(count);
  }
  return text;
}

std::optional<std::string> file_type_label(uint32_t file_type) {
  if (auto preset = quant::preset_of_file_type(file_type)) return std::string(preset->name);
  return std::nullopt;
}

std::string quantization_label(const weight_store& weights, std::optional<uint32_t> file_type) {
  if (file_type) {
    if (auto label = file_type_label(*file_type)) return *label;
  }
  std::map<dtype, uint64_t> bytes;
  for (const auto& [name, tensor] : weights.tensors()) bytes[tensor.type] += tensor.num_bytes;
  if (bytes.empty()) return "none";
  const auto largest =
      std::max_element(bytes.begin(), bytes.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return ggml_style_name(largest->first);
}

}  // namespace troupe
