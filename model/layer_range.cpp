#include "model/layer_range.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
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

std::vector<layer_range> split_layers_by_capacity(const std::vector<size_t>& layer_bytes, size_t first_stage_extra,
                                                  size_t last_stage_extra, const std::vector<double>& capacities) {
  const int num_layers = static_cast<int>(layer_bytes.size());
  const int num_stages = static_cast<int>(capacities.size());
  if (num_stages < 1 || num_stages > num_layers) {
    throw std::runtime_error("cannot split " + std::to_string(num_layers) + " layers into " +
                             std::to_string(num_stages) + " pipeline stages (1 to one per layer)");
  }
  for (double capacity : capacities) {
    if (!(capacity > 0)) throw std::runtime_error("a pipeline stage's capacity must be positive");
  }
  // The contiguous split whose fullest stage (its bytes over its capacity) is least full: the
  // slowest stage paces the pipeline, and the fullest node bounds the model. best[s][e] is that
  // share over layers [0, e) cut into s + 1 stages. Layers and stages are few (hundreds, tens),
  // so the square is cheap.
  std::vector<size_t> prefix(static_cast<size_t>(num_layers) + 1, 0);
  for (int i = 0; i < num_layers; ++i) prefix[i + 1] = prefix[i] + layer_bytes[static_cast<size_t>(i)];
  auto share = [&](int stage, int first, int end) {
    size_t bytes = prefix[static_cast<size_t>(end)] - prefix[static_cast<size_t>(first)];
    if (first == 0) bytes += first_stage_extra;
    if (end == num_layers) bytes += last_stage_extra;
    return static_cast<double>(bytes) / capacities[static_cast<size_t>(stage)];
  };
  constexpr double unreachable = std::numeric_limits<double>::infinity();
  const size_t width = static_cast<size_t>(num_layers) + 1;
  std::vector<double> best(static_cast<size_t>(num_stages) * width, unreachable);
  std::vector<int> cut(best.size(), 0);  // where the last of those stages begins
  for (int e = 1; e <= num_layers; ++e) best[static_cast<size_t>(e)] = share(0, 0, e);
  for (int s = 1; s < num_stages; ++s) {
    for (int e = s + 1; e <= num_layers; ++e) {
      const size_t at = static_cast<size_t>(s) * width + static_cast<size_t>(e);
      // The earliest cut wins a tie, so equal layers split the same way every time.
      for (int b = s; b < e; ++b) {
        const double before = best[static_cast<size_t>(s - 1) * width + static_cast<size_t>(b)];
        if (before == unreachable) continue;
        const double fullest = std::max(before, share(s, b, e));
        if (fullest < best[at]) {
          best[at] = fullest;
          cut[at] = b;
        }
      }
    }
  }
  std::vector<layer_range> stages(static_cast<size_t>(num_stages));
  int end = num_layers;
  for (int s = num_stages - 1; s >= 0; --s) {
    const int first = s == 0 ? 0 : cut[static_cast<size_t>(s) * width + static_cast<size_t>(end)];
    stages[static_cast<size_t>(s)] = {first, end};
    end = first;
  }
  return stages;
}

std::vector<layer_range> split_layers_by_bytes(const std::vector<size_t>& layer_bytes, size_t first_stage_extra,
                                               size_t last_stage_extra, int num_stages) {
  if (num_stages < 1) {
    throw std::runtime_error("cannot split " + std::to_string(layer_bytes.size()) + " layers into " +
                             std::to_string(num_stages) + " pipeline stages (1 to one per layer)");
  }
  return split_layers_by_capacity(layer_bytes, first_stage_extra, last_stage_extra,
                                  std::vector<double>(static_cast<size_t>(num_stages), 1.0));
}

}  // namespace troupe
