// The ZeroMQ codec judges the sampling values by the shared rules: each edge case of
// sampling_door_cases.hpp gets its verdict and names its field.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "protocol/codec.hpp"
#include "tests/protocol/sampling_door_cases.hpp"

namespace troupe {
namespace {

using nlohmann::json;

std::variant<client_request, protocol_error> decode_with(const json& fields) {
  json request = {{"type", "generate"}, {"id", "r1"}, {"prompt", "Once"}};
  request.update(fields);
  const std::vector<uint8_t> frame = json::to_msgpack(request);
  protocol_limits limits;
  limits.max_model_len = testing::door_case_max_model_len;
  return decode_request(std::string(frame.begin(), frame.end()), limits);
}

TEST(codec_sampling, every_edge_case_gets_the_shared_verdict) {
  for (const auto& c : testing::sampling_door_cases()) {
    auto result = decode_with(c.fields);
    const auto* error = std::get_if<protocol_error>(&result);
    if (!c.refused_field) {
      EXPECT_FALSE(error) << c.fields.dump() << " -> " << error->message;
      continue;
    }
    if (!error) {
      ADD_FAILURE() << c.fields.dump() << " was accepted";
      continue;
    }
    EXPECT_EQ(error->code, error_code::bad_request);
    EXPECT_EQ(error->id, "r1");
    EXPECT_EQ(error->message.rfind("field '" + std::string(c.refused_field) + "': ", 0), 0u)
        << c.fields.dump() << " -> " << error->message;
  }
}

TEST(codec_sampling, top_k_minus_one_reaches_the_engine_as_off) {
  auto result = decode_with({{"top_k", -1}});
  ASSERT_TRUE(std::holds_alternative<client_request>(result)) << std::get<protocol_error>(result).message;
  EXPECT_EQ(std::get<generate_request>(std::get<client_request>(result)).sampling.top_k, 0);
}

TEST(codec_sampling, the_default_max_tokens_fits_a_small_context) {
  json request = {{"type", "generate"}, {"id", "r1"}, {"prompt", "Once"}};
  const std::vector<uint8_t> frame = json::to_msgpack(request);
  protocol_limits limits;
  limits.max_model_len = 8;
  auto result = decode_request(std::string(frame.begin(), frame.end()), limits);
  ASSERT_TRUE(std::holds_alternative<client_request>(result)) << std::get<protocol_error>(result).message;
  EXPECT_EQ(std::get<generate_request>(std::get<client_request>(result)).sampling.max_tokens, 8);
}

}  // namespace
}  // namespace troupe
