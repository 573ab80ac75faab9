// prompt_logprobs (vLLM's extension) through the real server, its prompts cut into 8-token chunks:
// a greedy continuation's logprobs over ZeroMQ equal the prompt logprobs of the same token ids
// fed back as a prompt (over ZeroMQ and over HTTP, completions and chat, streamed and not, in
// vLLM's shape: null first, then {"token id": {logprob, rank, decoded_token}}), and a count above
// 20 is a 400 naming the field.

#include <gtest/gtest.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/e2e/serve_process.hpp"

namespace troupe::test {
namespace {

using json = nlohmann::json;

constexpr int top_n = 2;
constexpr int num_outputs = 12;

json post(int port, const std::string& path, const json& body, int& status) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto res = c.Post(path, body.dump(), "application/json");
  status = res ? res->status : -1;
  if (!res) return json();
  if (body.value("stream", false)) return json(res->body);
  return json::parse(res->body);
}

// The server-sent events' JSON payloads.
std::vector<json> events_of(const std::string& body) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n", at);
    const std::string payload = body.substr(at + 6, end - at - 6);
    if (payload != "[DONE]") out.push_back(json::parse(payload));
    at = end;
  }
  return out;
}

// An HTTP prompt_logprobs list against the ZeroMQ one for the same prompt.
void expect_same_as_zmq(const json& list, const std::vector<int32_t>& prompt, const std::vector<prompt_logprob>& zmq,
                        const std::string& what) {
  ASSERT_TRUE(list.is_array()) << what << ": " << list.dump();
  ASSERT_EQ(list.size(), prompt.size()) << what;
  EXPECT_TRUE(list[0].is_null()) << what;
  for (size_t i = 1; i < list.size(); ++i) {
    const json& position = list[i];
    const prompt_logprob& z = zmq[i - 1];
    const std::string key = std::to_string(prompt[i]);
    ASSERT_TRUE(position.contains(key)) << what << " position " << i << ": " << position.dump();
    EXPECT_NEAR(position[key]["logprob"].get<float>(), z.logprob, 1e-6f) << what << " position " << i;
    EXPECT_EQ(position[key]["rank"].get<int>(), z.rank) << what << " position " << i;
    EXPECT_TRUE(position[key]["decoded_token"].is_string());
    // The prompt's token and the top n (one fewer entry when the token is among them).
    EXPECT_EQ(position.size(), z.rank <= top_n ? top_n : top_n + 1) << what << " position " << i;
    for (const auto& [id, value] : z.top)
      EXPECT_TRUE(position.contains(std::to_string(id))) << what << " position " << i;
  }
}

TEST(prompt_logprobs_e2e, equal_a_greedy_continuations_logprobs_over_zmq_and_http) {
  TROUPE_REQUIRE_SHARED_MODEL(stories_dir);
  serve_process server({"--http-port", "0", "--served-model-name", "m", "--max-num-batched-tokens", "8"});
  int status = 0;
  const json tokenized = post(server.http_port(), "/tokenize", {{"prompt", "Once upon a time there"}}, status);
  ASSERT_EQ(status, 200) << tokenized.dump();
  std::vector<int32_t> text = tokenized["tokens"].get<std::vector<int32_t>>();
  const size_t prompt_size = text.size();

  client c = server.make_client();
  generate_request greedy;
  greedy.prompt_token_ids = text;
  greedy.sampling.temperature = 0.0f;
  greedy.sampling.max_tokens = num_outputs;
  greedy.sampling.ignore_eos = true;
  greedy.sampling.logprobs = top_n;
  std::vector<token_logprob> decoded;
  const completion continued = c.generate(greedy, [&](const delta_reply& d) {
    if (d.logprobs) decoded.insert(decoded.end(), d.logprobs->begin(), d.logprobs->end());
    EXPECT_FALSE(d.prompt_logprobs) << "not asked for";
  });
  ASSERT_EQ(continued.token_ids.size(), static_cast<size_t>(num_outputs));
  ASSERT_EQ(decoded.size(), continued.token_ids.size());
  text.insert(text.end(), continued.token_ids.begin(), continued.token_ids.end());

  // The whole text as a prompt: each generated position as decoding saw it.
  generate_request asking;
  asking.prompt_token_ids = text;
  asking.sampling.temperature = 0.0f;
  asking.sampling.max_tokens = 1;
  asking.sampling.prompt_logprobs = top_n;
  std::vector<prompt_logprob> prompt;
  int num_carrying = 0;
  c.generate(asking, [&](const delta_reply& d) {
    if (!d.prompt_logprobs) return;
    ++num_carrying;
    prompt = *d.prompt_logprobs;
  });
  EXPECT_EQ(num_carrying, 1);
  ASSERT_EQ(prompt.size(), text.size() - 1);
  for (size_t i = 0; i < prompt.size(); ++i) EXPECT_EQ(prompt[i].token_id, text[i + 1]) << "position " << i + 1;
  for (int k = 0; k < num_outputs; ++k) {
    const prompt_logprob& p = prompt[prompt_size - 1 + static_cast<size_t>(k)];
    SCOPED_TRACE("output " + std::to_string(k));
    EXPECT_NEAR(p.logprob, decoded[static_cast<size_t>(k)].logprob, 1e-4f);
    EXPECT_EQ(p.rank, 1);
    ASSERT_EQ(p.top.size(), static_cast<size_t>(top_n));
    for (int j = 0; j < top_n; ++j) {
      EXPECT_EQ(p.top[static_cast<size_t>(j)].first, decoded[static_cast<size_t>(k)].top[static_cast<size_t>(j)].first);
      EXPECT_NEAR(p.top[static_cast<size_t>(j)].second,
                  decoded[static_cast<size_t>(k)].top[static_cast<size_t>(j)].second, 1e-4f);
    }
  }

  // HTTP completions, whole and streamed: the same numbers in vLLM's shape.
  const json body = {
      {"model", "m"}, {"prompt", text}, {"max_tokens", 2}, {"temperature", 0}, {"prompt_logprobs", top_n}};
  const json whole = post(server.http_port(), "/v1/completions", body, status);
  ASSERT_EQ(status, 200) << whole.dump();
  expect_same_as_zmq(whole["choices"][0]["prompt_logprobs"], text, prompt, "completions");
  json streamed_body = body;
  streamed_body["stream"] = true;
  const json stream = post(server.http_port(), "/v1/completions", streamed_body, status);
  ASSERT_EQ(status, 200);
  int num_lists = 0;
  for (const json& chunk : events_of(stream.get<std::string>())) {
    if (chunk["choices"].empty() || !chunk["choices"][0].contains("prompt_logprobs")) continue;
    ++num_lists;
    expect_same_as_zmq(chunk["choices"][0]["prompt_logprobs"], text, prompt, "streamed completions");
  }
  EXPECT_EQ(num_lists, 1) << "once, with the first token";

  // A chat: one list beside the choices, as long as the templated prompt.
  const json chat = post(server.http_port(), "/v1/chat/completions",
                         {{"model", "m"},
                          {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                          {"max_tokens", 2},
                          {"prompt_logprobs", 0}},
                         status);
  ASSERT_EQ(status, 200) << chat.dump();
  ASSERT_TRUE(chat["prompt_logprobs"].is_array()) << chat.dump();
  EXPECT_EQ(chat["prompt_logprobs"].size(), chat["usage"]["prompt_tokens"].get<size_t>());
  EXPECT_TRUE(chat["prompt_logprobs"][0].is_null());
  for (size_t i = 1; i < chat["prompt_logprobs"].size(); ++i) EXPECT_EQ(chat["prompt_logprobs"][i].size(), 1u);

  // Bounds: vLLM's 20, and no negative count.
  for (int bad : {21, -1}) {
    json refused_body = body;
    refused_body["prompt_logprobs"] = bad;
    const json refused = post(server.http_port(), "/v1/completions", refused_body, status);
    EXPECT_EQ(status, 400) << refused.dump();
    EXPECT_NE(refused.dump().find("prompt_logprobs"), std::string::npos) << refused.dump();
  }
  asking.sampling.prompt_logprobs = 21;
  try {
    c.generate(asking);
    ADD_FAILURE() << "prompt_logprobs 21 accepted over ZeroMQ";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("prompt_logprobs"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe::test
