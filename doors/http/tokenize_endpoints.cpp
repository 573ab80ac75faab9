#include "doors/http/tokenize_endpoints.hpp"

#include "doors/http/chat_plan.hpp"
#include "doors/http/request_fields.hpp"

namespace troupe {

namespace {

using namespace request_json;

void check_model(request_fields& fields, const tokenize_context& context) {
  const json* model = fields.take("model");
  if (!model) return;
  const std::string name = read_string(*model, "model", 1024);
  if (name != context.model_name) {
    api_error e = bad_parameter(
        "model", "the model '" + name + "' does not exist; this server serves '" + context.model_name + "'");
    e.status = 404;
    e.code = "model_not_found";
    throw parameter_error{e};
  }
}

}  // namespace

std::variant<std::string, api_error> tokenize_response(std::string_view body, const tokenize_context& context) {
  auto parsed = parse_request_body(body, context.limits.max_json_depth);
  if (auto* error = std::get_if<api_error>(&parsed)) return *error;
  const json& root = std::get<json>(parsed);
  std::vector<std::string> ignored;
  try {
    request_fields fields(root, ignored);
    check_model(fields, context);
    bool return_strs = false;
    if (const json* v = fields.take("return_token_strs")) return_strs = read_bool(*v, "return_token_strs");
    std::vector<int32_t> ids;
    if (const json* prompt = fields.take("prompt")) {
      bool special = true;
      if (const json* v = fields.take("add_special_tokens")) special = read_bool(*v, "add_special_tokens");
      ids = context.tok.encode(read_string(*prompt, "prompt", context.limits.max_string_bytes), special);
    } else if (root.contains("messages")) {
      // Read as a chat request is read: the same messages, tools and template variables.
      json chat_body = json::object();
      chat_body["model"] = context.model_name;
      for (const char* key : {"messages", "tools", "tool_choice", "chat_template_kwargs", "reasoning_effort"}) {
        if (const json* v = fields.take(key)) chat_body[key] = *v;
      }
      bool generation_prompt = true, special = false;
      if (const json* v = fields.take("add_generation_prompt"))
        generation_prompt = read_bool(*v, "add_generation_prompt");
      if (const json* v = fields.take("add_special_tokens")) special = read_bool(*v, "add_special_tokens");
      auto chat = parse_openai_request(openai_endpoint::chat_completions, chat_body.dump(), context.limits);
      if (auto* error = std::get_if<api_error>(&chat)) return *error;
      const chat_request& c = std::get<openai_request>(chat).chat;
      json variables = c.template_kwargs;
      if (!c.tools.empty()) variables["tools"] = tools_for_template(c.tools);
      std::string text;
      try {
        text = context.prompt.render(c.messages, variables, generation_prompt);
      } catch (const std::exception& e) {
        fail("messages", std::string("the model's chat template cannot render them: ") + e.what());
      }
      ids = context.tok.encode(text, special || !context.prompt.has_template());
    } else {
      fail("prompt", "missing (give \"prompt\" or \"messages\")");
    }
    json out = json::object();
    out["count"] = ids.size();
    out["max_model_len"] = context.limits.max_model_len;
    out["tokens"] = ids;
    if (return_strs) {
      json strs = json::array();
      for (int32_t id : ids) strs.push_back(context.tok.id_to_token(id));
      out["token_strs"] = std::move(strs);
    } else {
      out["token_strs"] = nullptr;
    }
    return out.dump(-1, ' ', false, json::error_handler_t::replace);
  } catch (const parameter_error& e) {
    return e.error;
  }
}

std::variant<std::string, api_error> detokenize_response(std::string_view body, const tokenize_context& context) {
  auto parsed = parse_request_body(body, context.limits.max_json_depth);
  if (auto* error = std::get_if<api_error>(&parsed)) return *error;
  const json& root = std::get<json>(parsed);
  std::vector<std::string> ignored;
  try {
    request_fields fields(root, ignored);
    check_model(fields, context);
    const json* tokens = fields.take("tokens");
    if (!tokens) fail("tokens", "missing");
    const std::vector<int32_t> ids = read_token_ids(*tokens, "tokens", context.limits.max_prompt_token_ids);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] >= context.tok.vocab_size()) {
        fail("tokens[" + std::to_string(i) + "]",
             std::to_string(ids[i]) + " is outside the vocabulary of " + std::to_string(context.tok.vocab_size()));
      }
    }
    json out = json::object();
    out["prompt"] = context.tok.decode(ids);
    return out.dump(-1, ' ', false, json::error_handler_t::replace);
  } catch (const parameter_error& e) {
    return e.error;
  }
}

std::string version_response() { return json{{"version", TROUPE_VERSION}}.dump(); }

}  // namespace troupe
