// The client plane's decoder: every malformed or out-of-range request gives an error naming the
// field and problem; valid requests round-trip through encode_request.

#include <gtest/gtest.h>

#include <msgpack.hpp>

#include "protocol/codec.hpp"

namespace troupe {
namespace {

// Packs a map from (key, packing function) pairs, so tests can build any frame, broken or not.
class frame_builder {
 public:
  using packer = msgpack::packer<msgpack::sbuffer>;
  frame_builder& add(const std::string& key, std::function<void(packer&)> value) {
    entries_.emplace_back(key, std::move(value));
    return *this;
  }
  template <class T>
  frame_builder& set(const std::string& key, T value) {
    return add(key, [value](packer& p) { p.pack(value); });
  }
  std::string build() const {
    msgpack::sbuffer buffer;
    packer p(buffer);
    p.pack_map(static_cast<uint32_t>(entries_.size()));
    for (const auto& [key, value] : entries_) {
      p.pack(key);
      value(p);
    }
    return std::string(buffer.data(), buffer.size());
  }

 private:
  std::vector<std::pair<std::string, std::function<void(packer&)>>> entries_;
};

frame_builder valid_generate() {
  frame_builder b;
  b.set("type", std::string("generate")).set("id", std::string("r1")).set("prompt", std::string("Once"));
  return b;
}

std::string error_of(const std::string& frame) {
  auto result = decode_request(frame);
  auto* error = std::get_if<protocol_error>(&result);
  return error ? error->message : std::string("<no error>");
}

TEST(protocol_codec, decodes_a_minimal_generate_with_defaults) {
  auto result = decode_request(valid_generate().build());
  ASSERT_TRUE(std::holds_alternative<client_request>(result)) << error_of(valid_generate().build());
  const auto& request = std::get<generate_request>(std::get<client_request>(result));
  EXPECT_EQ(request.id, "r1");
  EXPECT_EQ(*request.prompt, "Once");
  EXPECT_TRUE(request.stream);
  EXPECT_EQ(request.sampling.max_tokens, sampling_params{}.max_tokens);
}

TEST(protocol_codec, round_trips_every_field) {
  generate_request request;
  request.id = "abc";
  request.messages = std::vector<chat_message>{{"system", "be brief"}, {"user", "hi"}};
  request.sampling.temperature = 0.5f;
  request.sampling.top_k = 40;
  request.sampling.top_p = 0.9f;
  request.sampling.min_p = 0.05f;
  request.sampling.repetition_penalty = 1.1f;
  request.sampling.presence_penalty = 0.25f;
  request.sampling.frequency_penalty = -0.5f;
  request.sampling.seed = 1234567890123ull;
  request.sampling.max_tokens = 77;
  request.sampling.stop_token_ids = {2, 13};
  request.sampling.ignore_eos = true;
  request.sampling.logprobs = 3;
  request.sampling.prompt_logprobs = 4;
  request.stream = false;
  request.priority = -4;
  request.targets = service_targets{"team-a", 250, 40};
  request.api_key = "secret";
  auto result = decode_request(encode_request(request));
  ASSERT_TRUE(std::holds_alternative<client_request>(result));
  const auto& got = std::get<generate_request>(std::get<client_request>(result));
  EXPECT_EQ(got.id, "abc");
  ASSERT_TRUE(got.messages);
  ASSERT_EQ(got.messages->size(), 2u);
  EXPECT_EQ((*got.messages)[1].content, "hi");
  EXPECT_FLOAT_EQ(got.sampling.temperature, 0.5f);
  EXPECT_EQ(got.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(got.sampling.top_p, 0.9f);
  EXPECT_FLOAT_EQ(got.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(got.sampling.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(got.sampling.presence_penalty, 0.25f);
  EXPECT_FLOAT_EQ(got.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(got.sampling.seed, 1234567890123ull);
  EXPECT_EQ(got.sampling.max_tokens, 77);
  EXPECT_EQ(got.sampling.stop_token_ids, (std::vector<int32_t>{2, 13}));
  EXPECT_TRUE(got.sampling.ignore_eos);
  EXPECT_EQ(got.sampling.logprobs, 3);
  EXPECT_EQ(got.sampling.prompt_logprobs, 4);
  EXPECT_FALSE(got.stream);
  EXPECT_EQ(got.priority, -4);
  EXPECT_EQ(got.targets.tenant, "team-a");
  EXPECT_EQ(got.targets.ttft_ms, 250);
  EXPECT_EQ(got.targets.tpot_ms, 40);
  EXPECT_EQ(got.api_key, "secret");
}

TEST(protocol_codec, refuses_a_bad_slo_naming_the_field) {
  auto refusal = [](const std::string& slo_json_like, auto pack_slo) {
    msgpack::sbuffer buffer;
    msgpack::packer<msgpack::sbuffer> p(buffer);
    p.pack_map(4);
    p.pack(std::string("type"));
    p.pack(std::string("generate"));
    p.pack(std::string("id"));
    p.pack(std::string("r1"));
    p.pack(std::string("prompt"));
    p.pack(std::string("hi"));
    p.pack(std::string("slo"));
    pack_slo(p);
    auto result = decode_request(std::string_view(buffer.data(), buffer.size()));
    EXPECT_TRUE(std::holds_alternative<protocol_error>(result)) << slo_json_like;
    return std::holds_alternative<protocol_error>(result) ? std::get<protocol_error>(result).message : std::string();
  };
  std::string why = refusal("{ttft_ms: -5}", [](auto& p) {
    p.pack_map(1);
    p.pack(std::string("ttft_ms"));
    p.pack(-5);
  });
  EXPECT_NE(why.find("'slo.ttft_ms'"), std::string::npos) << why;
  EXPECT_NE(why.find("zero or positive"), std::string::npos) << why;
  why = refusal("{tpot_ms: \"fast\"}", [](auto& p) {
    p.pack_map(1);
    p.pack(std::string("tpot_ms"));
    p.pack(std::string("fast"));
  });
  EXPECT_NE(why.find("'slo.tpot_ms'"), std::string::npos) << why;
  why = refusal("{deadline: 1}", [](auto& p) {
    p.pack_map(1);
    p.pack(std::string("deadline"));
    p.pack(1);
  });
  EXPECT_NE(why.find("deadline"), std::string::npos) << why;
  why = refusal("7", [](auto& p) { p.pack(7); });
  EXPECT_NE(why.find("'slo'"), std::string::npos) << why;
}

TEST(protocol_codec, round_trips_abort_and_stats) {
  auto abort = decode_request(encode_request(abort_request{"x9", "k"}));
  ASSERT_TRUE(std::holds_alternative<client_request>(abort));
  EXPECT_EQ(std::get<abort_request>(std::get<client_request>(abort)).id, "x9");
  auto stats = decode_request(encode_request(stats_request{"s", ""}));
  ASSERT_TRUE(std::holds_alternative<client_request>(stats));
  EXPECT_TRUE(std::holds_alternative<stats_request>(std::get<client_request>(stats)));
}

TEST(protocol_codec, broken_msgpack_is_an_error) {
  EXPECT_NE(error_of(std::string("\xc1", 1)).find("malformed msgpack"), std::string::npos);
  EXPECT_NE(error_of(std::string("\x85\xa4type", 6)).find("malformed msgpack"), std::string::npos);
  EXPECT_NE(error_of("").find("empty frame"), std::string::npos);
  std::string frame = valid_generate().build() + "x";
  EXPECT_NE(error_of(frame).find("trailing bytes"), std::string::npos);
}

TEST(protocol_codec, a_small_frame_announcing_a_huge_array_is_refused) {
  // array32 header claiming 2^31 entries, then nothing: must not allocate or crash.
  std::string frame("\x81\xa6prompt\xdd\x80\x00\x00\x00", 12);
  EXPECT_NE(error_of(frame).find("malformed msgpack"), std::string::npos);
}

TEST(protocol_codec, not_a_map_and_wrong_types_name_the_problem) {
  msgpack::sbuffer buffer;
  msgpack::pack(buffer, 42);
  EXPECT_NE(error_of(std::string(buffer.data(), buffer.size())).find("expected a map"), std::string::npos);
  EXPECT_NE(error_of(valid_generate().set("temperature", std::string("hot")).build()).find("'temperature'"),
            std::string::npos);
  EXPECT_NE(error_of(valid_generate().set("stream", 1).build()).find("'stream': expected a bool"), std::string::npos);
  frame_builder b;
  b.set("type", std::string("generate")).set("id", 5).set("prompt", std::string("x"));
  EXPECT_NE(error_of(b.build()).find("'id': expected a string"), std::string::npos);
}

TEST(protocol_codec, unknown_and_duplicate_fields_are_refused) {
  EXPECT_NE(error_of(valid_generate().set("temprature", 0.5).build()).find("unknown field 'temprature'"),
            std::string::npos);
  EXPECT_NE(error_of(valid_generate().set("prompt", std::string("again")).build()).find("given twice"),
            std::string::npos);
  frame_builder b;
  b.set("type", std::string("abort")).set("id", std::string("a")).set("prompt", std::string("x"));
  EXPECT_NE(error_of(b.build()).find("unknown field 'prompt'"), std::string::npos);
}

TEST(protocol_codec, max_tokens_out_of_range) {
  EXPECT_NE(error_of(valid_generate().set("max_tokens", -5).build()).find("'max_tokens': -5 is out of range"),
            std::string::npos);
  EXPECT_NE(error_of(valid_generate().set("max_tokens", 0).build()).find("'max_tokens'"), std::string::npos);
  EXPECT_NE(error_of(valid_generate().set("max_tokens", uint64_t(1) << 40).build()).find("'max_tokens'"),
            std::string::npos);
}

TEST(protocol_codec, sampling_ranges) {
  EXPECT_NE(error_of(valid_generate().set("top_p", 0.0).build()).find("'top_p'"), std::string::npos);
  EXPECT_NE(error_of(valid_generate().set("temperature", -1.0).build()).find("'temperature'"), std::string::npos);
  EXPECT_NE(error_of(valid_generate().set("top_k", -2).build()).find("'top_k'"), std::string::npos);
  EXPECT_NE(error_of(valid_generate().set("seed", -1).build()).find("'seed'"), std::string::npos);
  EXPECT_NE(error_of(valid_generate().set("logprobs", 1000).build()).find("'logprobs'"), std::string::npos);
  EXPECT_NE(error_of(valid_generate().set("prompt_logprobs", 21).build()).find("'prompt_logprobs'"), std::string::npos);
  auto ok = decode_request(valid_generate().set("temperature", 0).set("logprobs", true).build());
  ASSERT_TRUE(std::holds_alternative<client_request>(ok));
  EXPECT_EQ(std::get<generate_request>(std::get<client_request>(ok)).sampling.logprobs, 0);
}

TEST(protocol_codec, prompt_presence_rules) {
  frame_builder none;
  none.set("type", std::string("generate")).set("id", std::string("r"));
  EXPECT_NE(error_of(none.build()).find("one of 'prompt'"), std::string::npos);
  EXPECT_NE(error_of(valid_generate()
                         .add("prompt_token_ids",
                              [](auto& p) {
                                p.pack(std::vector<int>{1, 2});
                              })
                         .build())
                .find("only one of"),
            std::string::npos);
  frame_builder empty;
  empty.set("type", std::string("generate")).set("id", std::string("r")).set("prompt", std::string(""));
  EXPECT_NE(error_of(empty.build()).find("'prompt': is empty"), std::string::npos);
  frame_builder negative_ids;
  negative_ids.set("type", std::string("generate")).set("id", std::string("r"));
  negative_ids.add("prompt_token_ids", [](auto& p) { p.pack(std::vector<int>{1, -2}); });
  EXPECT_NE(error_of(negative_ids.build()).find("'prompt_token_ids[1]'"), std::string::npos);
  frame_builder bad_message;
  bad_message.set("type", std::string("generate")).set("id", std::string("r"));
  bad_message.add("messages", [](auto& p) {
    p.pack_array(1);
    p.pack_map(1);
    p.pack(std::string("role"));
    p.pack(std::string("user"));
  });
  EXPECT_NE(error_of(bad_message.build()).find("'messages[0].content': missing"), std::string::npos);
}

TEST(protocol_codec, bounds_on_sizes) {
  protocol_limits limits;
  limits.max_frame_bytes = 64;
  auto big = decode_request(valid_generate().set("prompt_x", std::string(100, 'a')).build(), limits);
  ASSERT_TRUE(std::holds_alternative<protocol_error>(big));
  EXPECT_NE(std::get<protocol_error>(big).message.find("exceeds the limit"), std::string::npos);
  frame_builder long_id;
  long_id.set("type", std::string("abort")).set("id", std::string(1000, 'i'));
  EXPECT_NE(error_of(long_id.build()).find("'id': longer than"), std::string::npos);
}

TEST(protocol_codec, error_keeps_the_id_when_readable) {
  auto result = decode_request(valid_generate().set("max_tokens", -1).build());
  ASSERT_TRUE(std::holds_alternative<protocol_error>(result));
  EXPECT_EQ(std::get<protocol_error>(result).id, "r1");
}

TEST(protocol_codec, replies_round_trip) {
  delta_reply delta;
  delta.id = "r";
  delta.text = "hello";
  delta.token_ids = {5, 6};
  delta.logprobs = std::vector<token_logprob>{{5, -0.5f, {{5, -0.5f}, {7, -1.5f}}}};
  delta.prompt_logprobs = std::vector<prompt_logprob>{{403, -2.5f, 3, {{9, -0.25f}, {11, -1.0f}}}};
  delta.finish_reason = "length";
  delta.usage = usage_info{3, 2, 1};
  delta.timings = timing_info{0.001, 0.01, 0.002, 0.02};
  auto got = std::get<delta_reply>(decode_reply(encode_reply(delta)));
  EXPECT_EQ(got.text, "hello");
  EXPECT_EQ(got.token_ids, delta.token_ids);
  ASSERT_TRUE(got.logprobs);
  EXPECT_EQ((*got.logprobs)[0].top[1].first, 7);
  ASSERT_TRUE(got.prompt_logprobs);
  ASSERT_EQ(got.prompt_logprobs->size(), 1u);
  EXPECT_EQ((*got.prompt_logprobs)[0].token_id, 403);
  EXPECT_EQ((*got.prompt_logprobs)[0].logprob, -2.5f);
  EXPECT_EQ((*got.prompt_logprobs)[0].rank, 3);
  EXPECT_EQ((*got.prompt_logprobs)[0].top, (std::vector<std::pair<int32_t, float>>{{9, -0.25f}, {11, -1.0f}}));
  EXPECT_EQ(*got.finish_reason, "length");
  EXPECT_EQ(got.usage->completion_tokens, 2);
  EXPECT_EQ(got.usage->num_preemptions, 1);
  EXPECT_DOUBLE_EQ(got.timings->ttft, 0.01);
  auto error = std::get<error_reply>(decode_reply(encode_reply(error_reply{"q", error_code::overloaded, "full"})));
  EXPECT_EQ(error.code, error_code::overloaded);
  EXPECT_EQ(error.message, "full");
  auto stats = std::get<stats_reply>(decode_reply(encode_reply(stats_reply{"s", 10, 20, 1, 2, 3})));
  EXPECT_EQ(stats.num_free_blocks, 10);
  EXPECT_EQ(stats.num_requests_in_flight, 3);
}

}  // namespace
}  // namespace troupe
