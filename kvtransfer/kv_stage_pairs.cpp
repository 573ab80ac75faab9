#include "kvtransfer/kv_stage_pairs.hpp"

#include <limits>
#include <stdexcept>

namespace troupe {

std::string kv_stage_route_text(const kv_stage_route& route) {
  return layer_range_text(route.layers) + "\n" + route.endpoint + "\n" + route.public_key;
}

kv_stage_route parse_kv_stage_route(std::string_view text) {
  const auto refuse = [](const std::string& what) { throw std::invalid_argument("a KV stage route: " + what); };
  if (text.size() > kv_stage_route_max_bytes) {
    refuse(std::to_string(text.size()) + " bytes, at most " + std::to_string(kv_stage_route_max_bytes));
  }
  const size_t first_cut = text.find('\n');
  const size_t second_cut = first_cut == std::string_view::npos ? first_cut : text.find('\n', first_cut + 1);
  if (second_cut == std::string_view::npos || text.find('\n', second_cut + 1) != std::string_view::npos) {
    refuse("expected three lines (layers, endpoint, key)");
  }
  for (const char c : text) {
    if (c != '\n' && (c < 0x21 || c > 0x7e)) refuse("a byte that is not printable ASCII");
  }
  kv_stage_route route;
  try {
    route.layers = parse_layer_range(text.substr(0, first_cut), std::numeric_limits<int>::max());
  } catch (const std::runtime_error& e) {
    refuse(e.what());
  }
  route.endpoint = std::string(text.substr(first_cut + 1, second_cut - first_cut - 1));
  route.public_key = std::string(text.substr(second_cut + 1));
  if (route.endpoint.empty()) refuse("no endpoint");
  return route;
}

}  // namespace troupe
