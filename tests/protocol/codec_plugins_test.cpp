// Logits plugins on the ZeroMQ wire: a request's `plugins` (the names of the logits plugins it
// wants) travels from the client library to the door unchanged, is left out when empty (a client
// still reaches servers from before the field), and its values are judged by the sampling rules.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "protocol/codec.hpp"

namespace troupe {
namespace {

using nlohmann::json;

std::variant<client_request, protocol_error> decode_json(const json& request) {
  const std::vector<uint8_t> frame = json::to_msgpack(request);
  return decode_request(std::string(frame.begin(), frame.end()));
}

TEST(codec_plugins, the_names_round_trip_and_are_left_out_when_none) {
  generate_request request;
  request.id = "p1";
  request.prompt = "Once upon a time";
  std::string frame = encode_request(request);
  EXPECT_FALSE(json::from_msgpack(std::vector<uint8_t>(frame.begin(), frame.end())).contains("plugins"));
  request.sampling.logits_plugins = {"banned_phrases", "other"};
  frame = encode_request(request);
  EXPECT_EQ(json::from_msgpack(std::vector<uint8_t>(frame.begin(), frame.end())).at("plugins"),
            json({"banned_phrases", "other"}));
  auto decoded = decode_request(frame);
  ASSERT_TRUE(std::holds_alternative<client_request>(decoded));
  EXPECT_EQ(std::get<generate_request>(std::get<client_request>(decoded)).sampling.logits_plugins,
            (std::vector<std::string>{"banned_phrases", "other"}));
}

TEST(codec_plugins, bad_names_are_refused_naming_the_field) {
  struct bad_case {
    json value;
    const char* words;
  };
  for (const bad_case& c :
       {bad_case{"banned_phrases", "field 'plugins': expected an array of strings, got string"},
        bad_case{json::array({1}), "field 'plugins[0]'"}, bad_case{json::array({""}), "field 'plugins[0]': is empty"},
        bad_case{json::array({"a", "a"}), "field 'plugins[1]': names 'a' a second time"},
        bad_case{json::array({"a", "b", "c", "d", "e", "f", "g", "h", "i"}), "field 'plugins': more than 8 entries"},
        bad_case{json::array({std::string(129, 'x')}), "longer than 128 bytes"}}) {
    auto result = decode_json({{"type", "generate"}, {"id", "p2"}, {"prompt", "x"}, {"plugins", c.value}});
    ASSERT_TRUE(std::holds_alternative<protocol_error>(result)) << c.value.dump() << " was accepted";
    const protocol_error& error = std::get<protocol_error>(result);
    EXPECT_EQ(error.code, error_code::bad_request);
    EXPECT_NE(error.message.find(c.words), std::string::npos) << error.message;
  }
}

}  // namespace
}  // namespace troupe
