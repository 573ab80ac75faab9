#include "doors/http/chat_plan.hpp"

#include "doors/http/tool_grammar.hpp"
#include "grammar/grammar_error.hpp"
#include "grammar/guided_grammar.hpp"

namespace troupe {

namespace {

using json = nlohmann::ordered_json;

bool harmony_output(const chat_format& f) {
  return f.reasoning == reasoning_syntax::harmony || f.tools == tool_call_syntax::harmony;
}

// The variables the template gets besides the messages.
json template_variables(const chat_request& chat, const chat_format& format) {
  for (const char* taken : {"messages", "add_generation_prompt", "bos_token", "eos_token"}) {
    if (chat.template_kwargs.contains(taken)) {
      throw chat_plan_error{std::string("chat_template_kwargs.") + taken,
                            std::string("'chat_template_kwargs.") + taken + "': the server sets this variable itself"};
    }
  }
  json variables = chat.template_kwargs;
  if (!chat.tools.empty() && !variables.contains("tools")) variables["tools"] = tools_for_template(chat.tools);
  const std::string& effort = chat.reasoning_effort;
  if (!effort.empty()) {
    const bool off = effort == "none" || effort == "minimal";
    // gpt-oss's template knows low, medium and high; Qwen3's and the like switch thinking on or off.
    if (!variables.contains("reasoning_effort")) {
      variables["reasoning_effort"] = format.reasoning == reasoning_syntax::harmony && off ? "low" : effort;
    }
    if (format.reasoning == reasoning_syntax::think && !variables.contains("enable_thinking")) {
      variables["enable_thinking"] = !off;
    }
  }
  return variables;
}

// The messages as the family's template reads them: gpt-oss takes an earlier turn's reasoning as
// `thinking` (and refuses it beside content on a call turn).
json template_messages(const chat_request& chat, const chat_format& format) {
  if (!harmony_output(format)) return chat.messages;
  json messages = chat.messages;
  for (auto& m : messages) {
    auto reasoning = m.find("reasoning_content");
    if (reasoning == m.end()) continue;
    const auto content = m.find("content");
    const bool has_content =
        content != m.end() && content->is_string() && !content->get_ref<const std::string&>().empty();
    if (!has_content || !m.contains("tool_calls")) m["thinking"] = *reasoning;
    m.erase("reasoning_content");
  }
  return messages;
}

std::string trim_end(const std::string& s) {
  const size_t last = s.find_last_not_of(" \t\r\n");
  return last == std::string::npos ? std::string() : s.substr(0, last + 1);
}

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

chat_plan plan_chat(const chat_request& chat, const chat_prompt& prompt, const chat_format& format,
                    const guided_decoding& asked, const std::string& asked_param) {
  chat_plan plan;
  const json variables = template_variables(chat, format);
  try {
    plan.prompt = prompt.render(template_messages(chat, format), variables);
  } catch (const std::exception& e) {
    throw chat_plan_error{"messages",
                          std::string("'messages': the model's chat template cannot render them: ") + e.what()};
  }

  const bool harmony = harmony_output(format);
  const bool calls = chat.calls_tools();
  if (calls && format.tools == tool_call_syntax::none && chat.tool_choice != tool_choice_kind::automatic) {
    throw chat_plan_error{chat.tool_choice_param,
                          "'" + chat.tool_choice_param +
                              "': this model's chat template shows no tool-call syntax, so no call can be made "
                              "(the server's --tool-call-parser names one)"};
  }
  plan.parsing.format = format;
  plan.parsing.parse_tool_calls = calls && format.tools != tool_call_syntax::none;
  plan.parsing.parse_reasoning = format.reasoning != reasoning_syntax::none;
  plan.parsing.starts_in_reasoning = format.reasoning == reasoning_syntax::think && prompt_opens_reasoning(plan.prompt);
  // Llama's <|python_tag|>, Mistral's [TOOL_CALLS] and gpt-oss's channel markers are special
  // tokens: the text must keep them for the answer to be read back.
  const bool marked_calls = plan.parsing.parse_tool_calls && (format.tools == tool_call_syntax::llama3_json ||
                                                              format.tools == tool_call_syntax::mistral);
  plan.skip_special_tokens = !(marked_calls || harmony);

  answer_shape shape;
  shape.format = format;
  if (format.reasoning == reasoning_syntax::think) {
    if (plan.parsing.starts_in_reasoning) {
      shape.thinking = answer_shape::reasoning::open;
    } else if (!trim_end(plan.prompt).ends_with("</think>")) {  // a template that closed it: no thinking
      shape.thinking = answer_shape::reasoning::optional;
    }
  }
  const bool reasoning = shape.thinking != answer_shape::reasoning::none || harmony;
  const bool asked_guided = asked.kind != guided_kind::none;
  if (!plan.parsing.parse_tool_calls && !(asked_guided && reasoning)) {
    plan.guided = asked;  // nothing to add: the request's own constraint, if any, as it is
    plan.guided_param = asked_param;
    return plan;
  }

  std::vector<size_t> index;
  if (plan.parsing.parse_tool_calls) {
    for (size_t i = 0; i < chat.tools.size(); ++i) {
      if (chat.tool_choice == tool_choice_kind::function && chat.tools[i].name != chat.tool_choice_name) continue;
      shape.callable.push_back(&chat.tools[i]);
      index.push_back(i);
    }
    shape.calls_required = chat.tool_choice != tool_choice_kind::automatic;
    shape.parallel = chat.parallel_tool_calls && chat.tool_choice != tool_choice_kind::function;
  }
  try {
    if (asked_guided) shape.text_regex = guided_regex(asked);
    plan.guided.kind = guided_kind::regex;
    plan.guided.source = answer_regex(shape, index);
    plan.guided_param = shape.calls_required || !asked_guided ? chat.tools_param : asked_param;
  } catch (const grammar_error& e) {
    if (shape.calls_required || asked_guided) {
      const std::string param = shape.calls_required ? chat.tools_param : asked_param;
      throw chat_plan_error{param, "'" + param + "': cannot be enforced: " + e.what()};
    }
    // "auto" without a grammar still works: the model chooses freely and its calls are parsed.
    plan.guided = {};
    plan.note = std::string("tool calls not enforced: ") + e.what();
  }
  return plan;
}

std::string tool_call_id(tool_call_syntax syntax, uint64_t seed, int index) {
  uint64_t bits = mix(seed ^ mix(static_cast<uint64_t>(index) + 1));
  if (syntax == tool_call_syntax::mistral) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    std::string id;
    for (int i = 0; i < 9; ++i) {
      id.push_back(alphabet[bits % 62]);
      bits /= 62;
    }
    return id;
  }
  static const char hex[] = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 16; ++i) id.push_back(hex[(bits >> (4 * i)) & 15]);
  return id;
}

}  // namespace troupe
