#include "doors/http/openai_request.hpp"

#include <cmath>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "doors/http/guided_fields.hpp"
#include "doors/http/request_fields.hpp"
#include "grammar/guided_grammar.hpp"

namespace troupe {

namespace {

using namespace request_json;

std::string read_content(const json& v, const std::string& param, const protocol_limits& limits) {
  if (v.is_string()) return read_string(v, param, limits.max_string_bytes);
  if (!v.is_array()) wrong_type(param, "a string or an array of content parts", v);
  if (v.size() > limits.max_messages) fail(param, "more than " + std::to_string(limits.max_messages) + " parts");
  // Text parts are joined, as the chat templates of text-only models would see them.
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string where = param + "[" + std::to_string(i) + "]";
    const json& part = v[i];
    if (!part.is_object()) wrong_type(where, "a content part object", part);
    auto type = part.find("type");
    if (type == part.end()) fail(where + ".type", "missing");
    if (!type->is_string() || *type != "text") {
      fail(where + ".type", "only \"text\" content parts are supported, got " + type->dump());
    }
    auto body = part.find("text");
    if (body == part.end()) fail(where + ".text", "missing");
    text += read_string(*body, where + ".text", limits.max_string_bytes);
    if (text.size() > limits.max_string_bytes)
      fail(param, "longer than " + std::to_string(limits.max_string_bytes) + " bytes");
  }
  return text;
}

// An assistant turn's tool_calls as templates read them: the arguments, which OpenAI carries as
// JSON text, become the object they spell (templates write them with tojson); text that is not an
// object stays a string.
json read_tool_calls(const json& v, const std::string& where, std::vector<std::string>& ignored) {
  if (!v.is_array()) wrong_type(where, "an array of tool calls", v);
  json calls = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!v[i].is_object()) wrong_type(at, "a tool call object", v[i]);
    request_fields fields(v[i], ignored, at);
    json call = json::object();
    const json* id = fields.take("id");
    call["id"] = id ? read_string(*id, at + ".id", 256) : "call_" + std::to_string(i);
    if (const json* type = fields.take("type"); type && read_string(*type, at + ".type", 64) != "function") {
      fail(at + ".type", "only \"function\" tool calls are supported");
    }
    call["type"] = "function";
    const json* function = fields.take("function");
    if (!function) fail(at + ".function", "missing");
    if (!function->is_object()) wrong_type(at + ".function", "an object", *function);
    request_fields inner(*function, ignored, at + ".function");
    const json* name = inner.take("name");
    if (!name) fail(at + ".function.name", "missing");
    json out = json::object();
    out["name"] = read_string(*name, at + ".function.name", 256);
    const json* arguments = inner.take("arguments");
    if (!arguments) {
      out["arguments"] = json::object();
    } else if (arguments->is_string()) {
      const std::string& text = arguments->get_ref<const std::string&>();
      json parsed = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
      out["arguments"] = parsed.is_object() ? std::move(parsed) : *arguments;
    } else if (arguments->is_object()) {
      out["arguments"] = *arguments;
    } else {
      wrong_type(at + ".function.arguments", "a string of JSON", *arguments);
    }
    call["function"] = std::move(out);
    calls.push_back(std::move(call));
  }
  return calls;
}

json read_messages(const json& v, const protocol_limits& limits, std::vector<std::string>& ignored) {
  if (!v.is_array()) wrong_type("messages", "an array", v);
  if (v.empty()) fail("messages", "is empty");
  if (v.size() > limits.max_messages) fail("messages", "more than " + std::to_string(limits.max_messages) + " entries");
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  json messages = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!v[i].is_object()) wrong_type(where, "an object", v[i]);
    request_fields fields(v[i], ignored, where);
    json message = json::object();
    const json* role = fields.take("role");
    if (!role) fail(where + ".role", "missing");
    const std::string r = read_string(*role, where + ".role", 64);
    if (!roles.count(r))
      fail(where + ".role", "unknown role \"" + r + "\" (system, developer, user, assistant or tool)");
    message["role"] = r;
    const json* content = fields.take("content");
    const json* tool_calls = r == "assistant" ? fields.take("tool_calls") : nullptr;
    if (content) {
      message["content"] = read_content(*content, where + ".content", limits);
    } else if (r == "assistant") {
      message["content"] = "";  // a turn that only called tools: templates test and concatenate it
    } else {
      fail(where + ".content", "missing");
    }
    if (const json* name = fields.take("name")) message["name"] = read_string(*name, where + ".name", 256);
    if (tool_calls) message["tool_calls"] = read_tool_calls(*tool_calls, where + ".tool_calls", ignored);
    if (r == "tool") {
      if (const json* id = fields.take("tool_call_id"))
        message["tool_call_id"] = read_string(*id, where + ".tool_call_id", 256);
    }
    if (r == "assistant") {
      // An earlier turn's reasoning, as vLLM returns it (and as some clients name it).
      const json* reasoning = fields.take("reasoning_content");
      if (!reasoning) reasoning = fields.take("reasoning");
      if (reasoning)
        message["reasoning_content"] = read_string(*reasoning, where + ".reasoning_content", limits.max_string_bytes);
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

// `tools`: [{type: "function", function: {name, description?, parameters?, strict?}}].
std::vector<chat_tool> read_tools(const json& v, std::vector<std::string>& ignored) {
  constexpr size_t max_tools = 128;
  if (!v.is_array()) wrong_type("tools", "an array of tools", v);
  if (v.size() > max_tools) fail("tools", "more than " + std::to_string(max_tools) + " tools");
  std::vector<chat_tool> tools;
  std::set<std::string> names;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!v[i].is_object()) wrong_type(at, "a tool object", v[i]);
    request_fields fields(v[i], ignored, at);
    const json* type = fields.take("type");
    if (!type) fail(at + ".type", "missing (\"function\")");
    if (read_string(*type, at + ".type", 64) != "function") fail(at + ".type", "only \"function\" tools are supported");
    const json* function = fields.take("function");
    if (!function) fail(at + ".function", "missing");
    if (!function->is_object()) wrong_type(at + ".function", "an object", *function);
    request_fields inner(*function, ignored, at + ".function");
    chat_tool tool;
    const json* name = inner.take("name");
    if (!name) fail(at + ".function.name", "missing");
    tool.name = read_string(*name, at + ".function.name", 64);
    // OpenAI's rule; it also keeps names safe to spell inside the call syntaxes' JSON and markers.
    if (tool.name.empty() ||
        tool.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") !=
            std::string::npos) {
      fail(at + ".function.name", "\"" + tool.name + "\" must be 1 to 64 letters, digits, '_', '-' or '.'");
    }
    if (!names.insert(tool.name).second) fail(at + ".function.name", "\"" + tool.name + "\" names two tools");
    if (const json* d = inner.take("description"))
      tool.description = read_string(*d, at + ".function.description", 1 << 16);
    if (const json* p = inner.take("parameters")) {
      if (!p->is_object()) wrong_type(at + ".function.parameters", "a JSON schema (an object)", *p);
      tool.parameters = *p;
    }
    if (const json* strict = inner.take("strict"))
      (void)read_bool(*strict, at + ".function.strict");  // always followed
    tools.push_back(std::move(tool));
  }
  return tools;
}

void read_tool_choice(const json& v, chat_request& chat) {
  if (v.is_string()) {
    const std::string& c = v.get_ref<const std::string&>();
    if (c == "none") {
      chat.tool_choice = tool_choice_kind::none;
    } else if (c == "auto") {
      chat.tool_choice = tool_choice_kind::automatic;
    } else if (c == "required") {
      chat.tool_choice = tool_choice_kind::required;
    } else {
      fail("tool_choice",
           "\"" + c + "\" is not one of \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}");
    }
  } else if (v.is_object()) {
    const auto function = v.find("function");
    if (v.value("type", std::string()) != "function" || function == v.end() || !function->is_object() ||
        !function->contains("name") || !(*function)["name"].is_string()) {
      fail("tool_choice", "expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    chat.tool_choice = tool_choice_kind::function;
    chat.tool_choice_name = (*function)["name"].get<std::string>();
  } else {
    wrong_type("tool_choice", "a string or an object", v);
  }
  if (chat.tool_choice == tool_choice_kind::required && chat.tools.empty())
    fail("tool_choice", "\"required\" needs tools");
  if (chat.tool_choice == tool_choice_kind::function) {
    bool found = false;
    for (const auto& t : chat.tools) found = found || t.name == chat.tool_choice_name;
    if (!found) fail("tool_choice", "no tool is named \"" + chat.tool_choice_name + "\"");
  }
}

// The chat's own fields: the messages, tools and how to choose among them, and what reaches the
// template besides (chat_template_kwargs, reasoning_effort).
void read_chat(request_fields& fields, openai_request& r, const openai_limits& limits) {
  chat_request& chat = r.chat;
  const json* messages = fields.take("messages");
  if (!messages) fail("messages", "missing");
  chat.messages = read_messages(*messages, limits, r.ignored_fields);
  if (const json* v = fields.take("tools")) chat.tools = read_tools(*v, r.ignored_fields);
  chat.tool_choice = chat.tools.empty() ? tool_choice_kind::none : tool_choice_kind::automatic;
  if (const json* v = fields.take("tool_choice")) read_tool_choice(*v, chat);
  if (const json* v = fields.take("parallel_tool_calls"))
    chat.parallel_tool_calls = read_bool(*v, "parallel_tool_calls");
  if (const json* v = fields.take("chat_template_kwargs")) {
    if (!v->is_object()) wrong_type("chat_template_kwargs", "an object", *v);
    chat.template_kwargs = *v;
  }
  if (const json* v = fields.take("reasoning_effort")) {
    chat.reasoning_effort = read_string(*v, "reasoning_effort", 16);
    static const std::set<std::string> efforts = {"none", "minimal", "low", "medium", "high"};
    if (!efforts.count(chat.reasoning_effort)) {
      fail("reasoning_effort", "\"" + chat.reasoning_effort + "\" is not one of none, minimal, low, medium, high");
    }
  }
  openai_prompt prompt;
  prompt.kind = prompt_kind::rendered_chat;  // its text once the door has rendered it
  r.prompts.push_back(std::move(prompt));
}

// `prompt` (completions) or `input` (embeddings): a string, strings, token ids, or arrays of them.
std::vector<openai_prompt> read_prompts(const json& v, const openai_limits& limits, const std::string& name,
                                        int max_prompts) {
  const protocol_limits& p = limits;
  auto text_prompt = [&](const json& s, const std::string& param) {
    openai_prompt prompt;
    prompt.text = read_string(s, param, p.max_string_bytes);
    if (prompt.text.empty()) fail(param, "is empty");
    return prompt;
  };
  auto id_prompt = [&](const json& a, const std::string& param) {
    openai_prompt prompt;
    prompt.kind = prompt_kind::token_ids;
    prompt.token_ids = read_token_ids(a, param, p.max_prompt_token_ids);
    if (prompt.token_ids.empty()) fail(param, "is empty");
    return prompt;
  };
  std::vector<openai_prompt> prompts;
  if (v.is_string()) {
    prompts.push_back(text_prompt(v, name));
  } else if (v.is_array()) {
    if (v.empty()) fail(name, "is empty");
    if (v[0].is_number_integer()) {
      prompts.push_back(id_prompt(v, name));  // one prompt of token ids
    } else {
      if (v.size() > static_cast<size_t>(max_prompts))
        fail(name, "more than " + std::to_string(max_prompts) + " entries");
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string param = name + "[" + std::to_string(i) + "]";
        if (v[i].is_string()) {
          prompts.push_back(text_prompt(v[i], param));
        } else if (v[i].is_array()) {
          prompts.push_back(id_prompt(v[i], param));
        } else {
          wrong_type(param, "a string or an array of token ids", v[i]);
        }
      }
    }
  } else {
    wrong_type(name, "a string, an array of strings or an array of token ids", v);
  }
  return prompts;
}

// POST /v1/embeddings: the inputs, each an engine request that runs its prompt and samples one
// token it ignores (the worker sends the pooled hidden states with it).
void read_embeddings(request_fields& fields, openai_request& r, const openai_limits& limits) {
  const json* input = fields.take("input");
  if (!input) fail("input", "missing");
  r.prompts = read_prompts(*input, limits, "input", limits.max_embedding_inputs);
  if (const json* v = fields.take("encoding_format")) {
    const std::string format = read_string(*v, "encoding_format", 16);
    if (format != "float" && format != "base64")
      fail("encoding_format", "\"" + format + "\" is not \"float\" or \"base64\"");
    r.embedding_base64 = format == "base64";
  }
  if (const json* v = fields.take("dimensions"))
    r.embedding_dimensions = static_cast<int>(read_int(*v, "dimensions", 1, 1 << 20));
  (void)fields.take("user");
  r.sampling.max_tokens = 1;
  r.sampling.temperature = 0.0f;
  r.sampling.num_speculative_tokens = 0;
}

// Troupe's scheduling fields: `priority` (lower runs first), `slo: {ttft_ms, tpot_ms}` (targets
// in milliseconds, zero or positive; 0: none) and `tenant`, which OpenAI's `user` stands in for
// when it is not given (the fair policy shares the engine among tenants).
void read_service(request_fields& fields, openai_request& r, const openai_limits& limits) {
  if (const json* v = fields.take("priority"))
    r.priority = static_cast<int>(read_int(*v, "priority", -1000000, 1000000));
  if (const json* v = fields.take("slo")) {
    if (!v->is_object()) wrong_type("slo", "an object", *v);
    request_fields slo(*v, r.ignored_fields, "slo");
    auto target = [&](const char* key, double& out) {
      const json* t = slo.take(key);
      if (t == nullptr) return;
      const std::string name = std::string("slo.") + key;
      if (!t->is_number()) wrong_type(name, "a number of milliseconds", *t);
      const double ms = t->get<double>();
      if (!std::isfinite(ms) || ms < 0) fail(name, "must be zero or positive (milliseconds), got " + t->dump());
      out = ms;
    };
    target("ttft_ms", r.targets.ttft_ms);
    target("tpot_ms", r.targets.tpot_ms);
  }
  const json* tenant = fields.take("tenant");
  const json* user = fields.take("user");
  if (tenant) {
    r.targets.tenant = read_string(*tenant, "tenant", limits.max_string_bytes);
  } else if (user) {
    r.targets.tenant = read_string(*user, "user", limits.max_string_bytes);
  }
}

// `stop`: one string or an array of them. Their number, emptiness and length are value rules
// (validate_sampling_params); only the wire bound on strings applies here.
std::vector<std::string> read_stop(const json& v, const protocol_limits& limits) {
  std::vector<std::string> stop;
  if (v.is_string()) {
    stop.push_back(read_string(v, "stop", limits.max_string_bytes));
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      stop.push_back(read_string(v[i], "stop[" + std::to_string(i) + "]", limits.max_string_bytes));
    }
  } else {
    wrong_type("stop", "a string or an array of strings", v);
  }
  return stop;
}

// Reads the sampling fields' JSON; their values are judged by validate_sampling_params, the
// rules the ZeroMQ door applies too. Where the OpenAI API names a field differently
// (max_completion_tokens, top_logprobs), a problem is reported under the name the client used.
void read_sampling(request_fields& fields, openai_request& r, const openai_limits& limits) {
  auto& s = r.sampling;
  const bool chat = r.endpoint == openai_endpoint::chat_completions;
  if (const json* v = fields.take("temperature")) s.temperature = read_float(*v, "temperature");
  if (const json* v = fields.take("top_p")) s.top_p = read_float(*v, "top_p");
  if (const json* v = fields.take("top_k")) s.top_k = read_int32(*v, "top_k");
  if (const json* v = fields.take("min_p")) s.min_p = read_float(*v, "min_p");
  if (const json* v = fields.take("presence_penalty")) s.presence_penalty = read_float(*v, "presence_penalty");
  if (const json* v = fields.take("frequency_penalty")) s.frequency_penalty = read_float(*v, "frequency_penalty");
  if (const json* v = fields.take("repetition_penalty")) s.repetition_penalty = read_float(*v, "repetition_penalty");
  if (const json* v = fields.take("seed")) {
    // Any integer is carried; a negative one (as two's complement) is refused by the value rules.
    if (!v->is_number_integer()) wrong_type("seed", "an integer", *v);
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  }
  const json* max_tokens = fields.take("max_tokens");
  const json* max_completion_tokens = chat ? fields.take("max_completion_tokens") : nullptr;
  if (max_tokens) s.max_tokens = read_int32(*max_tokens, "max_tokens");
  if (max_completion_tokens) {
    // It wins over max_tokens (OpenAI's newer name); a max_tokens beside it is only type-checked.
    s.max_tokens = read_int32(*max_completion_tokens, "max_completion_tokens");
  } else if (!max_tokens) {
    // OpenAI's defaults: 16 for completions; a chat runs until it stops or the context ends.
    s.max_tokens = chat ? limits.max_model_len : std::min(16, limits.max_model_len);
  }
  if (const json* v = fields.take("stop")) s.stop = read_stop(*v, limits);
  if (const json* v = fields.take("plugins")) {
    // An extension (like vLLM's extra fields): the logits plugins this request wants.
    if (!v->is_array()) wrong_type("plugins", "an array of plugin names", *v);
    for (size_t i = 0; i < v->size() && i <= limits.max_logits_plugins; ++i) {
      s.logits_plugins.push_back(read_string((*v)[i], "plugins[" + std::to_string(i) + "]", limits.max_string_bytes));
    }
  }
  if (const json* v = fields.take("stop_token_ids")) {
    s.stop_token_ids = read_token_ids(*v, "stop_token_ids", limits.max_prompt_token_ids);
  }
  if (const json* v = fields.take("ignore_eos")) s.ignore_eos = read_bool(*v, "ignore_eos");
  if (const json* v = fields.take("num_speculative_tokens")) {
    s.num_speculative_tokens = read_int32(*v, "num_speculative_tokens");
  }
  if (const json* v = fields.take("logit_bias")) {
    // {"token id": bias}: the keys are token ids written as strings.
    if (!v->is_object()) wrong_type("logit_bias", "an object of token ids and biases", *v);
    if (v->size() > limits.max_logit_bias)
      fail("logit_bias", "more than " + std::to_string(limits.max_logit_bias) + " entries");
    for (auto it = v->begin(); it != v->end(); ++it) {
      const std::string param = "logit_bias." + it.key();
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(it.key(), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != it.key().size() || id < 0 || id > std::numeric_limits<int32_t>::max()) {
        fail("logit_bias", "\"" + it.key() + "\" is not a token id");
      }
      s.logit_bias.push_back({static_cast<int32_t>(id), read_float(it.value(), param)});
    }
  }
  bool top_logprobs = false;
  if (chat) {
    const json* logprobs = fields.take("logprobs");
    const bool want = logprobs && read_bool(*logprobs, "logprobs");
    if (const json* v = fields.take("top_logprobs")) {
      const int top = read_int32(*v, "top_logprobs");
      // A count of alternatives; "logprobs": false is how a chat turns them off.
      if (top < 0) fail("top_logprobs", std::to_string(top) + " is negative");
      if (!want && top > 0) fail("top_logprobs", "needs \"logprobs\": true");
      if (want) r.logprobs = top;
      top_logprobs = true;
    } else if (want) {
      r.logprobs = 0;
    }
  } else if (const json* v = fields.take("logprobs")) {
    r.logprobs = read_int32(*v, "logprobs");
  }
  s.logprobs = r.logprobs;
  // vLLM's extension, on completions and chats alike; null is none. (vLLM reads -1 as the
  // whole vocabulary; here it is refused with the rest of the negatives.)
  if (const json* v = fields.take("prompt_logprobs"); v && !v->is_null()) {
    s.prompt_logprobs = read_int32(*v, "prompt_logprobs");
    if (s.prompt_logprobs < 0) {
      fail("prompt_logprobs", std::to_string(s.prompt_logprobs) + " is negative (a count of alternatives in [0, " +
                                  std::to_string(limits.max_logprobs) + "])");
    }
  }
  if (auto problem = validate_sampling_params(s, limits)) {
    std::string param = problem->field;
    if (param == "max_tokens" && max_completion_tokens) param = "max_completion_tokens";
    if (param == "logprobs" && top_logprobs) param = "top_logprobs";
    fail(param, problem->problem);
  }
  normalize_sampling_params(s);
  r.logprobs = s.logprobs;
}

// Structured output (guided_fields.hpp), checked where every other value is: a schema or regex
// that cannot be compiled, or a max_tokens below its shortest output, is a 400 naming it.
void read_guided(request_fields& fields, openai_request& r, const openai_limits& limits) {
  guided_fields asked;
  asked.response_format = fields.take("response_format");
  asked.guided_json = fields.take("guided_json");
  asked.guided_regex = fields.take("guided_regex");
  asked.guided_choice = fields.take("guided_choice");
  std::string param;
  try {
    r.sampling.guided = read_guided_fields(asked, limits.max_string_bytes, param);
  } catch (const guided_field_error& e) {
    throw parameter_error{bad_parameter(e.param, e.problem)};
  }
  if (!is_guided(r.sampling)) return;
  r.guided_param = param;
  auto problem = validate_sampling_params(r.sampling, limits);
  if (!problem) problem = check_guided_decoding(r.sampling);
  if (problem) {
    // max_tokens here stands for max_completion_tokens too (whichever the client sent).
    fail(problem->field == "max_tokens" ? "max_tokens" : param, problem->problem);
  }
}

// Known OpenAI fields this server cannot honour: refused when they ask for something, accepted
// when they ask for the default; and those accepted without effect.
void refuse_unsupported(request_fields& fields, openai_request& r) {
  if (r.endpoint == openai_endpoint::completions) {
    if (const json* v = fields.take("echo")) r.echo = read_bool(*v, "echo");
    if (const json* v = fields.take("suffix"); v && !read_string(*v, "suffix", 1 << 20).empty()) {
      fail("suffix", "is not supported");
    }
    if (const json* v = fields.take("best_of"); v && read_int(*v, "best_of", 1, 1 << 20) != r.n) {
      fail("best_of", "only best_of = n is supported");
    }
  }
  for (const char* ignored : {"user", "metadata", "store", "service_tier"}) (void)fields.take(ignored);
}

}  // namespace

std::variant<openai_request, api_error> parse_openai_request(openai_endpoint endpoint, std::string_view body,
                                                             const openai_limits& limits) {
  auto parsed = parse_request_body(body, limits.max_json_depth);
  if (auto* error = std::get_if<api_error>(&parsed)) return *error;
  const json& root = std::get<json>(parsed);
  try {
    openai_request r;
    r.endpoint = endpoint;
    request_fields fields(root, r.ignored_fields);
    const json* model = fields.take("model");
    if (!model) fail("model", "missing");
    r.model = read_string(*model, "model", 1024);
    if (endpoint == openai_endpoint::completions) {
      const json* prompt = fields.take("prompt");
      if (!prompt) fail("prompt", "missing");
      r.prompts = read_prompts(*prompt, limits, "prompt", limits.max_prompts);
    } else if (endpoint == openai_endpoint::embeddings) {
      read_embeddings(fields, r, limits);
      fields.note_ignored();
      return r;
    } else {
      read_chat(fields, r, limits);
    }
    if (const json* v = fields.take("n")) r.n = static_cast<int>(read_int(*v, "n", 1, limits.max_n));
    if (r.num_choices() > limits.max_choices) {
      fail("n", std::to_string(r.prompts.size()) + " prompts x n = " + std::to_string(r.num_choices()) +
                    " choices; at most " + std::to_string(limits.max_choices));
    }
    if (const json* v = fields.take("stream")) r.stream = read_bool(*v, "stream");
    if (const json* v = fields.take("stream_options")) {
      if (!r.stream) fail("stream_options", "only allowed when \"stream\" is true");
      if (!v->is_object()) wrong_type("stream_options", "an object", *v);
      request_fields options(*v, r.ignored_fields, "stream_options");
      if (const json* usage = options.take("include_usage"))
        r.include_usage = read_bool(*usage, "stream_options.include_usage");
    }
    read_sampling(fields, r, limits);
    read_service(fields, r, limits);
    read_guided(fields, r, limits);
    refuse_unsupported(fields, r);
    fields.note_ignored();
    return r;
  } catch (const parameter_error& e) {
    return e.error;
  }
}

}  // namespace troupe
