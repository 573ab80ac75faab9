// Speculative decoding on the ZeroMQ wire: the request's num_speculative_tokens travels from the
// client library to the door unchanged (and is not sent when left to the server, so a client
// still reaches servers from before the field), and the final delta's usage carries the
// speculative figures only when the engine verified drafts.

#include <gtest/gtest.h>

#include <msgpack.hpp>
#include <nlohmann/json.hpp>

#include "protocol/codec.hpp"

namespace troupe {
namespace {

using nlohmann::json;

generate_request plain_request() {
  generate_request request;
  request.id = "s1";
  request.prompt = "Once upon a time";
  return request;
}

const generate_request& as_generate(const std::variant<client_request, protocol_error>& result) {
  if (const auto* error = std::get_if<protocol_error>(&result)) {
    static generate_request none;
    ADD_FAILURE() << "refused: " << error->message;
    return none;
  }
  return std::get<generate_request>(std::get<client_request>(result));
}

// The request's map as msgpack, read back as JSON to look at the keys the encoder wrote.
json frame_fields(const generate_request& request) {
  const std::string frame = encode_request(request);
  return json::from_msgpack(std::vector<uint8_t>(frame.begin(), frame.end()));
}

TEST(codec_speculative, the_draft_length_round_trips_through_the_client_encoding) {
  for (int n : {0, 1, 4, 16}) {
    generate_request request = plain_request();
    request.sampling.num_speculative_tokens = n;
    EXPECT_EQ(frame_fields(request).at("num_speculative_tokens"), n);
    EXPECT_EQ(as_generate(decode_request(encode_request(request))).sampling.num_speculative_tokens, n);
  }
}

TEST(codec_speculative, left_to_the_server_it_is_not_sent_and_decodes_as_the_default) {
  const generate_request request = plain_request();
  ASSERT_EQ(request.sampling.num_speculative_tokens, -1);
  EXPECT_FALSE(frame_fields(request).contains("num_speculative_tokens"));
  EXPECT_EQ(as_generate(decode_request(encode_request(request))).sampling.num_speculative_tokens, -1);
  // An explicit -1 (or nil) from another client means the same.
  json explicit_default = {{"type", "generate"}, {"id", "s2"}, {"prompt", "x"}, {"num_speculative_tokens", -1}};
  const std::vector<uint8_t> frame = json::to_msgpack(explicit_default);
  EXPECT_EQ(as_generate(decode_request(std::string(frame.begin(), frame.end()))).sampling.num_speculative_tokens, -1);
  json nil_value = {{"type", "generate"}, {"id", "s3"}, {"prompt", "x"}, {"num_speculative_tokens", nullptr}};
  const std::vector<uint8_t> nil_frame = json::to_msgpack(nil_value);
  EXPECT_EQ(
      as_generate(decode_request(std::string(nil_frame.begin(), nil_frame.end()))).sampling.num_speculative_tokens, -1);
}

TEST(codec_speculative, a_bad_value_is_refused_naming_the_field_and_the_range) {
  const protocol_limits limits;
  struct bad_case {
    json value;
    const char* words;
  };
  for (const bad_case& c :
       {bad_case{17, "17 is out of range [-1, 16]"}, bad_case{-2, "-2 is out of range [-1, 16]"},
        bad_case{int64_t{1} << 33, "does not fit in a 32-bit integer"},
        bad_case{"4", "expected an integer, got string"}, bad_case{1.5, "expected an integer, got float"}}) {
    json request = {{"type", "generate"}, {"id", "s4"}, {"prompt", "x"}, {"num_speculative_tokens", c.value}};
    const std::vector<uint8_t> frame = json::to_msgpack(request);
    auto result = decode_request(std::string(frame.begin(), frame.end()), limits);
    ASSERT_TRUE(std::holds_alternative<protocol_error>(result)) << c.value.dump() << " was accepted";
    const protocol_error& error = std::get<protocol_error>(result);
    EXPECT_EQ(error.id, "s4");
    EXPECT_EQ(error.code, error_code::bad_request);
    EXPECT_EQ(error.message.rfind("field 'num_speculative_tokens': ", 0), 0u) << error.message;
    EXPECT_NE(error.message.find(c.words), std::string::npos) << error.message;
  }
  // The server's limit is the bound, not a constant of the codec.
  protocol_limits smaller;
  smaller.max_speculative_tokens = 4;
  generate_request request = plain_request();
  request.sampling.num_speculative_tokens = 5;
  auto result = decode_request(encode_request(request), smaller);
  ASSERT_TRUE(std::holds_alternative<protocol_error>(result));
  EXPECT_NE(std::get<protocol_error>(result).message.find("5 is out of range [-1, 4]"), std::string::npos);
}

TEST(codec_speculative, usage_carries_the_speculative_figures_only_when_given) {
  delta_reply last;
  last.id = "s5";
  last.finish_reason = "length";
  last.usage = usage_info{7, 20, 0, speculative_usage{24, 18, 0.75, 20.0 / 6.0}};
  const std::string frame = encode_reply(last);
  const json wire = json::from_msgpack(std::vector<uint8_t>(frame.begin(), frame.end()));
  EXPECT_EQ(
      wire.at("usage").at("speculative"),
      (json{
          {"draft_tokens", 24}, {"accepted_tokens", 18}, {"acceptance_rate", 0.75}, {"tokens_per_step", 20.0 / 6.0}}));
  const auto got = std::get<delta_reply>(decode_reply(frame));
  ASSERT_TRUE(got.usage && got.usage->speculative);
  EXPECT_EQ(got.usage->speculative->draft_tokens, 24);
  EXPECT_EQ(got.usage->speculative->accepted_tokens, 18);
  EXPECT_DOUBLE_EQ(got.usage->speculative->acceptance_rate, 0.75);
  EXPECT_DOUBLE_EQ(got.usage->speculative->tokens_per_step, 20.0 / 6.0);
  EXPECT_EQ(got.usage->completion_tokens, 20);

  last.usage = usage_info{7, 20, 1};
  const std::string plain = encode_reply(last);
  const json plain_wire = json::from_msgpack(std::vector<uint8_t>(plain.begin(), plain.end()));
  EXPECT_FALSE(plain_wire.at("usage").contains("speculative"));
  EXPECT_EQ(plain_wire.at("usage").size(), 3u);
  const auto plain_got = std::get<delta_reply>(decode_reply(plain));
  ASSERT_TRUE(plain_got.usage);
  EXPECT_FALSE(plain_got.usage->speculative);
  EXPECT_EQ(plain_got.usage->num_preemptions, 1);
}

}  // namespace
}  // namespace troupe
