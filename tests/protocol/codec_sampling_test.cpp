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

namespace troupe {
namespace {

TEST(codec_sampling, guided_fields_travel_both_ways_and_only_one_at_a_time) {
  auto schema = decode_with({{"guided_json", R"({"type":"boolean"})"}});
  ASSERT_TRUE(std::holds_alternative<client_request>(schema)) << std::get<protocol_error>(schema).message;
  const generate_request& request = std::get<generate_request>(std::get<client_request>(schema));
  EXPECT_EQ(request.sampling.guided.kind, guided_kind::json_schema);
  EXPECT_EQ(request.sampling.guided.source, R"({"type":"boolean"})");
  // What the client library encodes, the door decodes to the same constraint.
  for (const guided_decoding& g :
       {guided_decoding{guided_kind::choice, "", {"yes", "no"}}, guided_decoding{guided_kind::regex, "[a-z]+", {}},
        guided_decoding{guided_kind::json_object, "", {}}}) {
    generate_request out = request;
    out.sampling.guided = g;
    auto back = decode_request(encode_request(client_request{out}), protocol_limits{});
    ASSERT_TRUE(std::holds_alternative<client_request>(back)) << std::get<protocol_error>(back).message;
    const auto& decoded = std::get<generate_request>(std::get<client_request>(back)).sampling.guided;
    EXPECT_EQ(decoded.kind, g.kind);
    EXPECT_EQ(decoded.source, g.source);
    EXPECT_EQ(decoded.choices, g.choices);
  }
  auto two = decode_with({{"guided_regex", "a"}, {"guided_choice", {"a"}}});
  ASSERT_TRUE(std::holds_alternative<protocol_error>(two));
  EXPECT_NE(std::get<protocol_error>(two).message.find("only one of"), std::string::npos);
  auto empty = decode_with({{"guided_choice", json::array()}});
  ASSERT_TRUE(std::holds_alternative<protocol_error>(empty));
  EXPECT_EQ(std::get<protocol_error>(empty).message.rfind("field 'guided_choice': ", 0), 0u);
}

}  // namespace
}  // namespace troupe
