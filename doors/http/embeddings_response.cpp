#include "doors/http/embeddings_response.hpp"

#include <cstring>

#include <nlohmann/json.hpp>

namespace troupe {

std::string base64_floats(const std::vector<float>& values) {
  static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(values.size() * 4, '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &values[i], 4);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + static_cast<size_t>(b)] = static_cast<char>((bits >> (8 * b)) & 0xFF);
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t chunk = 0;
    for (size_t k = 0; k < n; ++k)
      chunk |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + k])) << (16 - 8 * k);
    for (size_t k = 0; k < 4; ++k) out.push_back(k <= n ? alphabet[(chunk >> (18 - 6 * k)) & 63] : '=');
  }
  return out;
}

std::string embeddings_response_builder::body(const std::vector<choice_output>& choices, const usage_counts& usage) {
  nlohmann::json data = nlohmann::json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    nlohmann::json item = {{"object", "embedding"}, {"index", i}};
    if (base64_) {
      item["embedding"] = base64_floats(choices[i].embedding);
    } else {
      item["embedding"] = choices[i].embedding;
    }
    data.push_back(std::move(item));
  }
  return nlohmann::json{{"object", "list"},
                        {"data", std::move(data)},
                        {"model", model_},
                        {"usage", {{"prompt_tokens", usage.prompt_tokens}, {"total_tokens", usage.prompt_tokens}}}}
      .dump();
}

}  // namespace troupe
