#include "model/layer_range.hpp"

#include <charconv>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace troupe {

namespace {

// A whole non-negative decimal number, or nothing.
bool parse_index(std::string_view text, int& value) {
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc{} && end == text.data() + text.size() && value >= 0;
}

}  // namespace

layer_range parse_layer_range(std::string_view text, int num_layers) {
  const std::string quoted = "layer range '" + std::string(text) + "'";
  const size_t dash = text.find('-');
  int first = 0;
  int last = 0;
  const bool ok = dash == std::string_view::npos
                      ? parse_index(text, first) && parse_index(text, last)
                      : parse_index(text.substr(0, dash), first) && parse_index(text.substr(dash + 1), last);
  if (!ok) throw std::runtime_error(quoted + ": expected FIRST-LAST (e.g. \"0-15\", both included) or one layer");
  if (last < first) throw std::runtime_error(quoted + ": the last layer comes before the first");
  if (last >= num_layers) {
    throw std::runtime_error(quoted + ": the model has layers 0-" + std::to_string(num_layers - 1));
  }
  return {first, last + 1};
}

std::string layer_range_text(const layer_range& range) {
  return std::to_string(range.first) + "-" + std::to_string(range.end - 1);
}

void check_layer_range(const layer_range& range, int num_layers) {
  if (range.first < 0 || range.end <= range.first || range.end > num_layers) {
    throw std::runtime_error("layer range [" + std::to_string(range.first) + ", " + std::to_string(range.end) +
                             ") is not a non-empty range of the model's " + std::to_string(num_layers) + " layers");
  }
}

void check_pipeline_ranges(const std::vector<layer_range>& ranges, int num_layers) {
  if (ranges.empty()) throw std::runtime_error("a pipeline needs at least one stage");
  int next = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const layer_range& r = ranges[i];
    check_layer_range(r, num_layers);
    if (r.first != next) {
      throw std::runtime_error(
          "pipeline stage " + std::to_string(i) + " holds layers " + layer_range_text(r) +
          (r.first > next ? "; layers " + std::to_string(next) + "-" + std::to_string(r.first - 1) + " are in no stage"
                          : "; layer " + std::to_string(r.first) + " is in an earlier stage too"));
    }
    next = r.end;
  }
  if (next != num_layers) {
    throw std::runtime_error("the pipeline's stages end at layer " + std::to_string(next - 1) + "; layers " +
                             std::to_string(next) + "-" + std::to_string(num_layers - 1) + " are in no stage");
  }
}

std::vector<layer_range> split_layers_by_bytes(const std::vector<size_t>& layer_bytes, size_t first_stage_extra,
                                               size_t last_stage_extra, int num_stages) {
  const int num_layers = static_cast<int>(layer_bytes.size());
  if (num_stages < 1 || num_stages > num_layers) {
    throw std::runtime_error("cannot split " + std::to_string(num_layers) + " layers into " +
                             std::to_string(num_stages) + " pipeline stages (1 to one per layer)");
  }
  // Greedy on the running total: stage s ends at the first layer boundary past s+1 shares of the
  // whole, leaving at least one layer for each stage after it.
  const double total = static_cast<double>(std::accumulate(layer_bytes.begin(), layer_bytes.end(), size_t{0}) +
                                           first_stage_extra + last_stage_extra);
  std::vector<layer_range> stages;
  double so_far = static_cast<double>(first_stage_extra);
  int first = 0;
  for (int s = 0; s < num_stages - 1; ++s) {
    const double target = total * (s + 1) / num_stages;
    int end = first + 1;  // every stage gets a layer
    so_far += static_cast<double>(layer_bytes[static_cast<size_t>(first)]);
    const int latest_end = num_layers - (num_stages - 1 - s);  // leave one per later stage
    // Take the next layer while that brings the total closer to this stage's share.
    while (end < latest_end) {
      const double with_next = so_far + static_cast<double>(layer_bytes[static_cast<size_t>(end)]);
      if (std::abs(with_next - target) >= std::abs(so_far - target)) break;
      so_far = with_next;
      ++end;
    }
    stages.push_back({first, end});
    first = end;
  }
  stages.push_back({first, num_layers});
  return stages;
}

}  // namespace troupe
