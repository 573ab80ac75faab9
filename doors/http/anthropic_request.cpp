#include "doors/http/anthropic_request.hpp"

#include <set>

#include "doors/http/request_fields.hpp"

namespace troupe {

namespace {

using namespace request_json;

// A tool_result's content: a string, or text blocks (joined).
std::string read_result_content(const json& v, const std::string& where, const protocol_limits& limits,
                                std::vector<std::string>& ignored) {
  if (v.is_string()) return read_string(v, where, limits.max_string_bytes);
  if (!v.is_array()) wrong_type(where, "a string or an array of content blocks", v);
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!v[i].is_object()) wrong_type(at, "a content block", v[i]);
    request_fields block(v[i], ignored, at);
    const json* type = block.take("type");
    if (!type || read_string(*type, at + ".type", 64) != "text")
      fail(at + ".type", "only \"text\" blocks are supported here");
    const json* t = block.take("text");
    if (!t) fail(at + ".text", "missing");
    text += read_string(*t, at + ".text", limits.max_string_bytes);
  }
  return text;
}

// One message of Anthropic's shape into the chat's (OpenAI's, which templates read): a user
// turn's tool_result blocks become tool messages (before its text), an assistant turn's tool_use
// blocks its tool_calls and its thinking blocks its reasoning_content.
void read_message(const json& v, size_t index, const protocol_limits& limits, json& messages,
                  std::vector<std::string>& ignored) {
  const std::string where = "messages[" + std::to_string(index) + "]";
  if (!v.is_object()) wrong_type(where, "an object", v);
  request_fields fields(v, ignored, where);
  const json* role = fields.take("role");
  if (!role) fail(where + ".role", "missing");
  const std::string r = read_string(*role, where + ".role", 32);
  if (r != "user" && r != "assistant") fail(where + ".role", "\"" + r + "\" is not \"user\" or \"assistant\"");
  const json* content = fields.take("content");
  if (!content) fail(where + ".content", "missing");
  std::string text, reasoning;
  json calls = json::array();
  if (content->is_string()) {
    text = read_string(*content, where + ".content", limits.max_string_bytes);
  } else if (content->is_array()) {
    for (size_t i = 0; i < content->size(); ++i) {
      const std::string at = where + ".content[" + std::to_string(i) + "]";
      const json& b = (*content)[i];
      if (!b.is_object()) wrong_type(at, "a content block", b);
      request_fields block(b, ignored, at);
      const json* type = block.take("type");
      if (!type) fail(at + ".type", "missing");
      const std::string t = read_string(*type, at + ".type", 64);
      if (t == "text") {
        const json* s = block.take("text");
        if (!s) fail(at + ".text", "missing");
        text += read_string(*s, at + ".text", limits.max_string_bytes);
      } else if (t == "tool_use" && r == "assistant") {
        const json* id = block.take("id");
        const json* name = block.take("name");
        const json* input = block.take("input");
        if (!id) fail(at + ".id", "missing");
        if (!name) fail(at + ".name", "missing");
        if (input && !input->is_object()) wrong_type(at + ".input", "an object", *input);
        json function = {{"name", read_string(*name, at + ".name", 256)},
                         {"arguments", input ? *input : json::object()}};
        calls.push_back(
            {{"id", read_string(*id, at + ".id", 256)}, {"type", "function"}, {"function", std::move(function)}});
      } else if (t == "tool_result" && r == "user") {
        const json* id = block.take("tool_use_id");
        if (!id) fail(at + ".tool_use_id", "missing");
        const json* result = block.take("content");
        std::string result_text =
            result ? read_result_content(*result, at + ".content", limits, ignored) : std::string();
        if (const json* error = block.take("is_error"); error && read_bool(*error, at + ".is_error")) {
          result_text = "Error: " + result_text;
        }
        messages.push_back(
            {{"role", "tool"}, {"tool_call_id", read_string(*id, at + ".tool_use_id", 256)}, {"content", result_text}});
      } else if (t == "thinking" && r == "assistant") {
        const json* s = block.take("thinking");
        if (s) reasoning += read_string(*s, at + ".thinking", limits.max_string_bytes);
        (void)block.take("signature");
      } else if (t == "redacted_thinking" && r == "assistant") {
        (void)block.take("data");  // opaque: nothing a template could show
      } else {
        fail(at + ".type", "\"" + t + "\" blocks are not supported in a " + r + " message (text" +
                               (r == "user" ? ", tool_result" : ", tool_use, thinking") + ")");
      }
    }
  } else {
    wrong_type(where + ".content", "a string or an array of content blocks", *content);
  }
  // A user turn of tool results alone adds no user message.
  if (r == "user" && text.empty() && content->is_array() && !content->empty() && !messages.empty() &&
      messages.back()["role"] == "tool") {
    return;
  }
  json message = {{"role", r}, {"content", text}};
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  messages.push_back(std::move(message));
}

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
    if (const json* type = fields.take("type")) {
      const std::string t = read_string(*type, at + ".type", 64);
      if (t != "custom") fail(at + ".type", "\"" + t + "\": only client tools (with an input_schema) are supported");
    }
    chat_tool tool;
    const json* name = fields.take("name");
    if (!name) fail(at + ".name", "missing");
    tool.name = read_string(*name, at + ".name", 64);
    if (tool.name.empty() ||
        tool.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") !=
            std::string::npos) {
      fail(at + ".name", "\"" + tool.name + "\" must be 1 to 64 letters, digits, '_', '-' or '.'");
    }
    if (!names.insert(tool.name).second) fail(at + ".name", "\"" + tool.name + "\" names two tools");
    if (const json* d = fields.take("description")) tool.description = read_string(*d, at + ".description", 1 << 16);
    const json* schema = fields.take("input_schema");
    if (!schema) fail(at + ".input_schema", "missing");
    if (!schema->is_object()) wrong_type(at + ".input_schema", "a JSON schema (an object)", *schema);
    tool.parameters = *schema;
    (void)fields.take("cache_control");
    tools.push_back(std::move(tool));
  }
  return tools;
}

void read_tool_choice(const json& v, chat_request& chat, std::vector<std::string>& ignored) {
  if (!v.is_object()) wrong_type("tool_choice", "an object", v);
  request_fields fields(v, ignored, "tool_choice");
  const json* type = fields.take("type");
  if (!type) fail("tool_choice.type", "missing");
  const std::string t = read_string(*type, "tool_choice.type", 16);
  if (t == "auto") {
    chat.tool_choice = chat.tools.empty() ? tool_choice_kind::none : tool_choice_kind::automatic;
  } else if (t == "any") {
    if (chat.tools.empty()) fail("tool_choice", "\"any\" needs tools");
    chat.tool_choice = tool_choice_kind::required;
  } else if (t == "none") {
    chat.tool_choice = tool_choice_kind::none;
  } else if (t == "tool") {
    const json* name = fields.take("name");
    if (!name) fail("tool_choice.name", "missing");
    chat.tool_choice = tool_choice_kind::function;
    chat.tool_choice_name = read_string(*name, "tool_choice.name", 64);
    bool found = false;
    for (const auto& tool : chat.tools) found = found || tool.name == chat.tool_choice_name;
    if (!found) fail("tool_choice.name", "no tool is named \"" + chat.tool_choice_name + "\"");
  } else {
    fail("tool_choice.type", "\"" + t + "\" is not one of auto, any, tool, none");
  }
  if (const json* d = fields.take("disable_parallel_tool_use")) {
    chat.parallel_tool_calls = !read_bool(*d, "tool_choice.disable_parallel_tool_use");
  }
}

}  // namespace

std::variant<openai_request, api_error> parse_anthropic_request(std::string_view body, const openai_limits& limits) {
  auto parsed = parse_request_body(body, limits.max_json_depth);
  if (auto* error = std::get_if<api_error>(&parsed)) return *error;
  const json& root = std::get<json>(parsed);
  try {
    openai_request r;
    r.endpoint = openai_endpoint::anthropic_messages;
    chat_request& chat = r.chat;
    chat.tool_choice_param = "tool_choice";
    request_fields fields(root, r.ignored_fields);
    const json* model = fields.take("model");
    if (!model) fail("model", "missing");
    r.model = read_string(*model, "model", 1024);
    const json* max_tokens = fields.take("max_tokens");
    if (!max_tokens) fail("max_tokens", "missing (Anthropic's API asks for it)");
    sampling_params& s = r.sampling;
    s.max_tokens = read_int32(*max_tokens, "max_tokens");

    if (const json* system = fields.take("system")) {
      std::string text = system->is_string() ? read_string(*system, "system", limits.max_string_bytes)
                                             : read_result_content(*system, "system", limits, r.ignored_fields);
      if (!text.empty()) chat.messages.push_back({{"role", "system"}, {"content", std::move(text)}});
    }
    const json* messages = fields.take("messages");
    if (!messages) fail("messages", "missing");
    if (!messages->is_array()) wrong_type("messages", "an array", *messages);
    if (messages->empty()) fail("messages", "is empty");
    if (messages->size() > limits.max_messages)
      fail("messages", "more than " + std::to_string(limits.max_messages) + " entries");
    for (size_t i = 0; i < messages->size(); ++i)
      read_message((*messages)[i], i, limits, chat.messages, r.ignored_fields);

    if (const json* v = fields.take("tools")) chat.tools = read_tools(*v, r.ignored_fields);
    chat.tool_choice = chat.tools.empty() ? tool_choice_kind::none : tool_choice_kind::automatic;
    if (const json* v = fields.take("tool_choice")) read_tool_choice(*v, chat, r.ignored_fields);
    if (const json* v = fields.take("thinking")) {
      // {"type": "enabled", "budget_tokens": n} or {"type": "disabled"}: the template's switch
      // (Qwen3's enable_thinking; a budget is not enforced).
      if (!v->is_object()) wrong_type("thinking", "an object", *v);
      request_fields thinking(*v, r.ignored_fields, "thinking");
      const json* type = thinking.take("type");
      if (!type) fail("thinking.type", "missing");
      const std::string t = read_string(*type, "thinking.type", 16);
      if (t != "enabled" && t != "disabled") fail("thinking.type", "\"" + t + "\" is not \"enabled\" or \"disabled\"");
      chat.template_kwargs["enable_thinking"] = t == "enabled";
      if (const json* budget = thinking.take("budget_tokens")) (void)read_int32(*budget, "thinking.budget_tokens");
    }
    if (const json* v = fields.take("stream")) r.stream = read_bool(*v, "stream");
    if (const json* v = fields.take("temperature")) s.temperature = read_float(*v, "temperature");
    if (const json* v = fields.take("top_p")) s.top_p = read_float(*v, "top_p");
    if (const json* v = fields.take("top_k")) s.top_k = read_int32(*v, "top_k");
    if (const json* v = fields.take("stop_sequences")) {
      if (!v->is_array()) wrong_type("stop_sequences", "an array of strings", *v);
      for (size_t i = 0; i < v->size(); ++i) {
        s.stop.push_back(read_string((*v)[i], "stop_sequences[" + std::to_string(i) + "]", limits.max_string_bytes));
      }
    }
    for (const char* ignored : {"metadata", "service_tier", "container", "mcp_servers"}) (void)fields.take(ignored);
    fields.note_ignored();
    if (auto problem = validate_sampling_params(s, limits)) {
      std::string param = problem->field;
      if (param.rfind("stop", 0) == 0) param = "stop_sequences" + param.substr(4);
      fail(param, problem->problem);
    }
    normalize_sampling_params(s);
    openai_prompt prompt;
    prompt.kind = prompt_kind::rendered_chat;
    r.prompts.push_back(std::move(prompt));
    return r;
  } catch (const parameter_error& e) {
    return e.error;
  }
}

}  // namespace troupe
