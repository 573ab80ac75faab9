#pragma once
// OpenAI's embeddings response: {object: "list", data: [{object: "embedding", index, embedding}],
// model, usage: {prompt_tokens, total_tokens}}, the vectors in the order of the inputs, as
// floats or (encoding_format "base64") as the base64 of their little-endian float32 bytes. Never
// streamed.

#include <string>

#include "doors/http/response_writer.hpp"

namespace troupe {

class embeddings_response_builder : public response_writer {
 public:
  embeddings_response_builder(std::string model, bool base64) : model_(std::move(model)), base64_(base64) {}

  std::string body(const std::vector<choice_output>& choices, const usage_counts& usage) override;
  std::string events(int, const choice_output&) override { return {}; }
  std::string end(const usage_counts&) override { return {}; }
  std::string failure(const api_error& error) override { return error.to_json(); }

 private:
  std::string model_;
  bool base64_;
};

// The base64 of `values` as little-endian float32 bytes.
std::string base64_floats(const std::vector<float>& values);

}  // namespace troupe
