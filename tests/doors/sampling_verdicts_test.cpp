// Both doors, side by side, on the same sampling values: the ZeroMQ codec and the OpenAI request
// parser accept the same cases and refuse the others naming the same field with the same words.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "doors/http/openai_request.hpp"
#include "protocol/codec.hpp"
#include "tests/protocol/sampling_door_cases.hpp"

namespace troupe {
namespace {

using nlohmann::json;

// What a door said: accepted (empty) or the message after "field 'x': " / "'x': ".
struct verdict {
  bool accepted = false;
  std::string field;
  std::string problem;
};

verdict split(const std::string& message, const std::string& prefix_before_quote) {
  verdict v;
  if (message.rfind(prefix_before_quote + "'", 0) != 0) {
    v.problem = message;
    return v;
  }
  const size_t open = prefix_before_quote.size() + 1;
  const size_t close = message.find("': ", open);
  if (close == std::string::npos) {
    v.problem = message;
    return v;
  }
  v.field = message.substr(open, close - open);
  v.problem = message.substr(close + 3);
  return v;
}

verdict zmq_verdict(const json& fields) {
  json request = {{"type", "generate"}, {"id", "r1"}, {"prompt", "Once"}};
  request.update(fields);
  const std::vector<uint8_t> frame = json::to_msgpack(request);
  protocol_limits limits;
  limits.max_model_len = testing::door_case_max_model_len;
  auto result = decode_request(std::string(frame.begin(), frame.end()), limits);
  if (auto* error = std::get_if<protocol_error>(&result)) return split(error->message, "field ");
  return {true, {}, {}};
}

verdict http_verdict(const json& fields, openai_request* parsed = nullptr) {
  json body = {{"model", "m"}, {"prompt", "Once"}};
  body.update(fields);
  openai_limits limits;
  limits.max_model_len = testing::door_case_max_model_len;
  auto result = parse_openai_request(openai_endpoint::completions, body.dump(), limits);
  if (auto* error = std::get_if<api_error>(&result)) {
    verdict v = split(error->message, "");
    EXPECT_EQ(error->param, v.field) << error->message;
    return v;
  }
  if (parsed) *parsed = std::get<openai_request>(result);
  return {true, {}, {}};
}

TEST(sampling_verdicts, both_doors_agree_on_every_edge_case) {
  for (const auto& c : testing::sampling_door_cases()) {
    const verdict zmq = zmq_verdict(c.fields);
    const verdict http = http_verdict(c.fields);
    EXPECT_EQ(http.accepted, !c.refused_field) << c.fields.dump() << " over HTTP: " << http.problem;
    EXPECT_EQ(zmq.accepted, http.accepted) << c.fields.dump() << ": ZeroMQ " << zmq.field << " " << zmq.problem
                                           << " / HTTP " << http.field << " " << http.problem;
    if (!c.refused_field) continue;
    EXPECT_EQ(http.field, c.refused_field) << c.fields.dump() << ": " << http.problem;
    EXPECT_EQ(zmq.field, http.field) << c.fields.dump();
    if (!c.wrong_type) {
      EXPECT_EQ(zmq.problem, http.problem) << c.fields.dump();
    }
  }
}

TEST(sampling_verdicts, http_passes_vllm_off_as_the_engine_spells_it) {
  openai_request r;
  ASSERT_TRUE(http_verdict({{"top_k", -1}}, &r).accepted);
  EXPECT_EQ(r.sampling.top_k, 0);
}

TEST(sampling_verdicts, chat_names_its_own_fields) {
  openai_limits limits;
  limits.max_model_len = testing::door_case_max_model_len;
  auto parse_chat = [&](const json& fields) {
    json body = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
    body.update(fields);
    auto result = parse_openai_request(openai_endpoint::chat_completions, body.dump(), limits);
    return std::holds_alternative<api_error>(result) ? std::get<api_error>(result).param : std::string("<accepted>");
  };
  EXPECT_EQ(parse_chat({{"max_completion_tokens", 513}}), "max_completion_tokens");
  EXPECT_EQ(parse_chat({{"max_tokens", 513}}), "max_tokens");
  EXPECT_EQ(parse_chat({{"logprobs", true}, {"top_logprobs", 21}}), "top_logprobs");
  EXPECT_EQ(parse_chat({{"logprobs", true}, {"top_logprobs", -1}}), "top_logprobs");
  EXPECT_EQ(parse_chat({{"logprobs", true}, {"top_logprobs", 20}, {"seed", 5}}), "<accepted>");
}

}  // namespace
}  // namespace troupe
