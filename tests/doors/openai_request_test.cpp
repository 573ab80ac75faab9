// OpenAI request bodies: what is accepted, what each field becomes, and the 400 (naming the
// parameter) for each kind of bad input.

#include <gtest/gtest.h>

#include "doors/http/api_error.hpp"
#include "doors/http/openai_request.hpp"

namespace troupe {
namespace {

openai_limits limits() {
  openai_limits l;
  l.max_model_len = 512;
  return l;
}

openai_request parse_ok(openai_endpoint endpoint, const std::string& body) {
  auto result = parse_openai_request(endpoint, body, limits());
  if (auto* error = std::get_if<api_error>(&result)) ADD_FAILURE() << body << " -> " << error->message;
  return std::get<openai_request>(result);
}

api_error parse_error(openai_endpoint endpoint, const std::string& body) {
  auto result = parse_openai_request(endpoint, body, limits());
  EXPECT_TRUE(std::holds_alternative<api_error>(result)) << body << " was accepted";
  return std::holds_alternative<api_error>(result) ? std::get<api_error>(result) : api_error{};
}

constexpr auto completions = openai_endpoint::completions;
constexpr auto chat = openai_endpoint::chat_completions;

TEST(openai_request, priority_slo_and_tenant_are_read_and_checked) {
  auto r = parse_ok(chat, R"({"model":"m","messages":[{"role":"user","content":"hi"}],"priority":-2,
      "slo":{"ttft_ms":250,"tpot_ms":40.5},"tenant":"team-a","user":"someone"})");
  EXPECT_EQ(r.priority, -2);
  EXPECT_EQ(r.targets.ttft_ms, 250);
  EXPECT_EQ(r.targets.tpot_ms, 40.5);
  EXPECT_EQ(r.targets.tenant, "team-a");
  // OpenAI's `user` names the tenant when no `tenant` is given.
  EXPECT_EQ(parse_ok(completions, R"({"model":"m","prompt":"x","user":"u7"})").targets.tenant, "u7");
  const auto defaults = parse_ok(completions, R"({"model":"m","prompt":"x"})");
  EXPECT_EQ(defaults.priority, 0);
  EXPECT_EQ(defaults.targets.ttft_ms, 0);
  EXPECT_EQ(defaults.targets.tenant, "");
  api_error e = parse_error(completions, R"({"model":"m","prompt":"x","slo":{"ttft_ms":-1}})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "slo.ttft_ms");
  EXPECT_NE(e.message.find("zero or positive"), std::string::npos) << e.message;
  EXPECT_EQ(parse_error(completions, R"({"model":"m","prompt":"x","slo":{"tpot_ms":"fast"}})").param, "slo.tpot_ms");
  EXPECT_EQ(parse_error(completions, R"({"model":"m","prompt":"x","slo":5})").param, "slo");
  EXPECT_EQ(parse_error(completions, R"({"model":"m","prompt":"x","priority":1.5})").param, "priority");
}

TEST(openai_request, an_slo_refusal_is_429_and_a_full_queue_503) {
  const api_error slo =
      from_engine_error(error_code::slo_unattainable, "request 3: its TTFT target of 5 ms cannot be met", "prompt");
  EXPECT_EQ(slo.status, 429);
  EXPECT_EQ(slo.code, "slo_unattainable");
  EXPECT_EQ(
      from_engine_error(error_code::overloaded, "request 3: the waiting queue is full (4 requests)", "prompt").status,
      503);
}

TEST(openai_request, completion_fields_map_to_sampling_params) {
  auto r = parse_ok(completions, R"({"model":"m","prompt":"Once","max_tokens":60,"temperature":0.5,
      "top_p":0.9,"top_k":40,"min_p":0.05,"presence_penalty":0.5,"frequency_penalty":-0.5,
      "repetition_penalty":1.1,"seed":7,"stop":["\n\n","The end"],"n":3,"logprobs":2,
      "stream":true,"stream_options":{"include_usage":true},"user":"someone"})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].kind, prompt_kind::text);
  EXPECT_EQ(r.prompts[0].text, "Once");
  EXPECT_EQ(r.sampling.max_tokens, 60);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.sampling.seed, 7u);
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"\n\n", "The end"}));
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.num_choices(), 3);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(r.sampling.logprobs, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(openai_request, defaults_follow_openai) {
  auto c = parse_ok(completions, R"({"model":"m","prompt":"x"})");
  EXPECT_EQ(c.sampling.max_tokens, 16);
  EXPECT_FALSE(c.stream);
  EXPECT_EQ(c.logprobs, -1);
  EXPECT_FALSE(c.sampling.seed);
  // A chat runs until it stops or the context is full.
  auto h = parse_ok(chat, R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(h.sampling.max_tokens, 512);
  // null means "not given".
  auto n = parse_ok(completions, R"({"model":"m","prompt":"x","max_tokens":null,"stop":null,"seed":null})");
  EXPECT_EQ(n.sampling.max_tokens, 16);
}

TEST(openai_request, prompts_as_string_ids_and_batches) {
  auto ids = parse_ok(completions, R"({"model":"m","prompt":[1,2,3]})");
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_EQ(ids.prompts[0].kind, prompt_kind::token_ids);
  EXPECT_EQ(ids.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
  auto batch = parse_ok(completions, R"({"model":"m","prompt":["a",[5,6]],"n":2})");
  ASSERT_EQ(batch.prompts.size(), 2u);
  EXPECT_EQ(batch.prompts[1].kind, prompt_kind::token_ids);
  EXPECT_EQ(batch.num_choices(), 4);
}

TEST(openai_request, chat_messages_with_content_parts) {
  auto r = parse_ok(chat, R"({"model":"m","messages":[{"role":"system","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"Hello "},{"type":"text","text":"there"}]},
      {"role":"assistant","content":null},{"role":"user","content":"go on","name":"ann"}],
      "max_completion_tokens":20,"logprobs":true,"top_logprobs":3,"stop":"END"})");
  ASSERT_EQ(r.prompts.size(), 1u);
  const auto& m = r.chat.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(r.prompts[0].kind, prompt_kind::rendered_chat);
  EXPECT_EQ(m[1]["content"], "Hello there");
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["content"], "");
  EXPECT_EQ(m[3]["name"], "ann");
  EXPECT_EQ(r.sampling.max_tokens, 20);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"END"});
  auto plain = parse_ok(chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true})");
  EXPECT_EQ(plain.logprobs, 0);
}

struct bad_case {
  openai_endpoint endpoint;
  const char* body;
  const char* param;  // "" when no single parameter is at fault
};

TEST(openai_request, each_bad_input_names_its_parameter) {
  const bad_case cases[] = {
      {completions, R"({"prompt":"x"})", "model"},
      {completions, R"({"model":5,"prompt":"x"})", "model"},
      {completions, R"({"model":"m"})", "prompt"},
      {completions, R"({"model":"m","prompt":5})", "prompt"},
      {completions, R"({"model":"m","prompt":""})", "prompt"},
      {completions, R"({"model":"m","prompt":[]})", "prompt"},
      {completions, R"({"model":"m","prompt":["a",5]})", "prompt[1]"},
      {completions, R"({"model":"m","prompt":[1,-2]})", "prompt[1]"},
      {completions, R"({"model":"m","prompt":"x","temperature":"hot"})", "temperature"},
      {completions, R"({"model":"m","prompt":"x","temperature":-1})", "temperature"},
      {completions, R"({"model":"m","prompt":"x","top_p":0})", "top_p"},
      {completions, R"({"model":"m","prompt":"x","top_p":1.5})", "top_p"},
      {completions, R"({"model":"m","prompt":"x","top_k":1.5})", "top_k"},
      {completions, R"({"model":"m","prompt":"x","min_p":2})", "min_p"},
      {completions, R"({"model":"m","prompt":"x","presence_penalty":3})", "presence_penalty"},
      {completions, R"({"model":"m","prompt":"x","frequency_penalty":true})", "frequency_penalty"},
      {completions, R"({"model":"m","prompt":"x","repetition_penalty":0})", "repetition_penalty"},
      {completions, R"({"model":"m","prompt":"x","seed":"7"})", "seed"},
      {completions, R"({"model":"m","prompt":"x","max_tokens":0})", "max_tokens"},
      {completions, R"({"model":"m","prompt":"x","max_tokens":"16"})", "max_tokens"},
      {completions, R"({"model":"m","prompt":"x","max_tokens":1000000000000})", "max_tokens"},
      {completions, R"({"model":"m","prompt":"x","max_tokens":513})", "max_tokens"},
      {completions, R"({"model":"m","prompt":"x","stop":5})", "stop"},
      {completions, R"({"model":"m","prompt":"x","stop":["a",""]})", "stop[1]"},
      {completions,
       R"({"model":"m","prompt":"x","stop":["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})",
       "stop"},
      {completions, R"({"model":"m","prompt":"x","n":0})", "n"},
      {completions, R"({"model":"m","prompt":"x","n":100})", "n"},
      {completions, R"({"model":"m","prompt":["a","b","c","d","e"],"n":16})", "n"},
      {completions, R"({"model":"m","prompt":"x","logprobs":21})", "logprobs"},
      {completions, R"({"model":"m","prompt":"x","logprobs":true})", "logprobs"},
      {completions, R"({"model":"m","prompt":"x","stream":"yes"})", "stream"},
      {completions, R"({"model":"m","prompt":"x","stream_options":{"include_usage":true}})", "stream_options"},
      {completions, R"({"model":"m","prompt":"x","best_of":3})", "best_of"},
      {completions, R"({"model":"m","prompt":"x","logit_bias":{"five":1}})", "logit_bias"},
      {completions, R"({"model":"m","prompt":"x","logit_bias":{"5":101}})", "logit_bias.5"},
      {completions, R"({"model":"m","prompt":"x","logit_bias":[5]})", "logit_bias"},
      {completions, R"({"model":"m","prompt":"x","num_speculative_tokens":17})", "num_speculative_tokens"},
      {completions, R"({"model":"m","prompt":"x","num_speculative_tokens":"4"})", "num_speculative_tokens"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"num_speculative_tokens":-2})",
       "num_speculative_tokens"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"num_speculative_tokens":2.5})",
       "num_speculative_tokens"},
      {chat, R"({"model":"m"})", "messages"},
      {chat, R"({"model":"m","messages":[]})", "messages"},
      {chat, R"({"model":"m","messages":"hi"})", "messages"},
      {chat, R"({"model":"m","messages":[{"content":"hi"}]})", "messages[0].role"},
      {chat, R"({"model":"m","messages":[{"role":"wizard","content":"hi"}]})", "messages[0].role"},
      {chat, R"({"model":"m","messages":[{"role":"user"}]})", "messages[0].content"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       "messages[0].content[0].type"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":0})",
       "max_completion_tokens"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
       "tools[0].function"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval"}]})",
       "tools[0].type"},
      {chat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]})",
       "tools[0].function.name"},
      {chat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]})",
       "tools[0].function.parameters"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice"},
      {chat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})",
       "tool_choice"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"})", "tool_choice"},
      {chat, R"({"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"type":"function"}]}]})",
       "messages[0].tool_calls[0].function"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":true})",
       "chat_template_kwargs"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"maximal"})",
       "reasoning_effort"},
      {chat,
       R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object","not":{}}}}})",
       "response_format"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}})",
       "response_format.type"},
      {chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})",
       "response_format.json_schema"},
      {completions, R"js({"model":"m","prompt":"x","guided_regex":"(?=a)b"})js", "guided_regex"},
      {completions, R"({"model":"m","prompt":"x","guided_choice":"yes"})", "guided_choice"},
      {completions, R"({"model":"m","prompt":"x","guided_choice":["yes"],"guided_regex":"a"})", "guided_choice"},
      {completions,
       R"({"model":"m","prompt":"x","guided_json":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]},"max_tokens":4})",
       "max_tokens"},
  };
  for (const auto& c : cases) {
    api_error e = parse_error(c.endpoint, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_NE(e.message.find(c.param), std::string::npos) << e.message;
  }
}

TEST(openai_request, unknown_fields_are_ignored_and_listed) {
  auto r = parse_ok(
      chat, R"({"model":"m","temprature":0,"messages":[{"role":"user","content":"x","extra":1,"cache_control":{}}],
      "stream":true,"stream_options":{"include_usage":true,"bogus":1},"reasoning":{"effort":"low"},
      "tools":[{"type":"function","function":{"name":"f","x-vendor":2},"other":3}]})");
  EXPECT_EQ(r.ignored_fields,
            (std::vector<std::string>{"messages[0].extra", "messages[0].cache_control", "tools[0].function.x-vendor",
                                      "tools[0].other", "stream_options.bogus", "temprature", "reasoning"}));
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(parse_ok(completions, R"({"model":"m","prompt":"x"})").ignored_fields.empty());
}

TEST(openai_request, tools_tool_choice_and_tool_turns_reach_the_chat) {
  auto r = parse_ok(chat, R"({"model":"m","messages":[
      {"role":"user","content":"Weather?"},
      {"role":"assistant","content":null,"reasoning_content":"need it","tool_calls":[{"id":"call_1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"zeta\": 1, \"alpha\": \"x\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"21C"}],
      "tools":[{"type":"function","function":{"name":"get_weather","description":"d",
        "parameters":{"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"}}},"strict":true}}],
      "tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false,
      "chat_template_kwargs":{"enable_thinking":false},"reasoning_effort":"low"})");
  ASSERT_EQ(r.chat.tools.size(), 1u);
  EXPECT_EQ(r.chat.tools[0].name, "get_weather");
  EXPECT_EQ(r.chat.tools[0].description, "d");
  EXPECT_LT(r.chat.tools[0].parameters.dump().find("zeta"), r.chat.tools[0].parameters.dump().find("alpha"));
  EXPECT_EQ(r.chat.tool_choice, tool_choice_kind::function);
  EXPECT_EQ(r.chat.tool_choice_name, "get_weather");
  EXPECT_FALSE(r.chat.parallel_tool_calls);
  EXPECT_EQ(r.chat.template_kwargs["enable_thinking"], false);
  EXPECT_EQ(r.chat.reasoning_effort, "low");
  const auto& call = r.chat.messages[1]["tool_calls"][0];
  // The arguments' JSON text becomes the object templates write with tojson, in the client's order.
  EXPECT_EQ(call["function"]["arguments"].dump(), R"({"zeta":1,"alpha":"x"})");
  EXPECT_EQ(r.chat.messages[1]["content"], "");
  EXPECT_EQ(r.chat.messages[1]["reasoning_content"], "need it");
  EXPECT_EQ(r.chat.messages[2]["tool_call_id"], "call_1");
  // Tools without a choice: auto; no tools: none.
  auto automatic = parse_ok(chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "tools":[{"type":"function","function":{"name":"f"}}]})");
  EXPECT_EQ(automatic.chat.tool_choice, tool_choice_kind::automatic);
  EXPECT_EQ(parse_ok(chat, R"({"model":"m","messages":[{"role":"user","content":"x"}]})").chat.tool_choice,
            tool_choice_kind::none);
  EXPECT_EQ(
      parse_ok(chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[],"tool_choice":"none"})")
          .chat.tool_choice,
      tool_choice_kind::none);
}

TEST(openai_request, logit_bias_and_echo) {
  auto r = parse_ok(completions, R"({"model":"m","prompt":"x","logit_bias":{"5":-100,"17":2.5},"echo":true})");
  ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(r.sampling.logit_bias[0].token_id, 5);
  EXPECT_FLOAT_EQ(r.sampling.logit_bias[0].bias, -100.0f);
  EXPECT_EQ(r.sampling.logit_bias[1].token_id, 17);
  EXPECT_TRUE(r.echo);
}

TEST(openai_request, num_speculative_tokens_is_an_extra_sampling_field_on_both_endpoints) {
  EXPECT_EQ(parse_ok(completions, R"({"model":"m","prompt":"x"})").sampling.num_speculative_tokens, -1);
  EXPECT_EQ(parse_ok(completions, R"({"model":"m","prompt":"x","num_speculative_tokens":null})")
                .sampling.num_speculative_tokens,
            -1);
  EXPECT_EQ(
      parse_ok(completions, R"({"model":"m","prompt":"x","num_speculative_tokens":4})").sampling.num_speculative_tokens,
      4);
  EXPECT_EQ(parse_ok(chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"num_speculative_tokens":0})")
                .sampling.num_speculative_tokens,
            0);
  EXPECT_EQ(parse_ok(chat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"num_speculative_tokens":16})")
                .sampling.num_speculative_tokens,
            16);
  api_error e = parse_error(completions, R"({"model":"m","prompt":"x","num_speculative_tokens":17})");
  EXPECT_EQ(e.message, "'num_speculative_tokens': 17 is out of range [-1, 16] (-1: the server's default, 0: off)");
}

TEST(openai_request, malformed_bodies) {
  for (const char* body : {"", "{", "{bad", "[1,2]", "\"text\"", "{\"model\":\"m\",\"prompt\":\"x\"} trailing"}) {
    api_error e = parse_error(completions, body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_TRUE(e.param.empty()) << body;
  }
  // Deep nesting is refused before it costs more than its bytes.
  std::string deep =
      "{\"model\":\"m\",\"prompt\":\"x\",\"user\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  api_error e = parse_error(completions, deep);
  EXPECT_NE(e.message.find("nests deeper"), std::string::npos) << e.message;
}

TEST(openai_request, error_json_has_openai_shape) {
  api_error e = bad_parameter("temperature", "'temperature': bad");
  EXPECT_EQ(
      e.to_json(),
      R"({"error":{"code":null,"message":"'temperature': bad","param":"temperature","type":"invalid_request_error"}})");
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

TEST(openai_request, reads_structured_output_fields_keeping_the_schema_order) {
  auto r = parse_ok(openai_endpoint::chat_completions,
                    R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":50,
                        "response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,
                        "schema":{"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"boolean"}},
                        "required":["zeta","alpha"]}}}})");
  EXPECT_EQ(r.sampling.guided.kind, guided_kind::json_schema);
  // The client's order, not nlohmann::json's sorted one: the output lists zeta first.
  EXPECT_LT(r.sampling.guided.source.find("zeta"), r.sampling.guided.source.find("alpha"));
  auto object =
      parse_ok(openai_endpoint::completions, R"({"model":"m","prompt":"x","response_format":{"type":"json_object"}})");
  EXPECT_EQ(object.sampling.guided.kind, guided_kind::json_object);
  auto text = parse_ok(openai_endpoint::completions, R"({"model":"m","prompt":"x","response_format":{"type":"text"}})");
  EXPECT_EQ(text.sampling.guided.kind, guided_kind::none);
  auto choice = parse_ok(openai_endpoint::completions, R"({"model":"m","prompt":"x","guided_choice":["yes","no"]})");
  EXPECT_EQ(choice.sampling.guided.kind, guided_kind::choice);
  EXPECT_EQ(choice.sampling.guided.choices, (std::vector<std::string>{"yes", "no"}));
  auto regex = parse_ok(openai_endpoint::completions, R"({"model":"m","prompt":"x","guided_regex":"[0-9]+"})");
  EXPECT_EQ(regex.sampling.guided.source, "[0-9]+");
  auto json_text = parse_ok(openai_endpoint::completions,
                            R"({"model":"m","prompt":"x","max_tokens":16,"guided_json":"{\"type\":\"boolean\"}"})");
  EXPECT_EQ(json_text.sampling.guided.kind, guided_kind::json_schema);
}

}  // namespace
}  // namespace troupe
