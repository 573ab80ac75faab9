#include "text/chat_format.hpp"

namespace troupe {

namespace {

bool has(std::string_view text, std::string_view marker) { return text.find(marker) != std::string_view::npos; }

}  // namespace

chat_format detect_chat_format(std::string_view source) {
  chat_format f;
  // gpt-oss writes every message as <|start|>role<|channel|>...<|message|>...; its channels carry
  // both the reasoning and the calls.
  if (has(source, "<|channel|>") && has(source, "<|message|>")) {
    f.tools = tool_call_syntax::harmony;
    f.reasoning = reasoning_syntax::harmony;
    return f;
  }
  if (has(source, "<tool_call>")) {
    f.tools = tool_call_syntax::hermes;
  } else if (has(source, "[TOOL_CALLS]")) {
    f.tools = tool_call_syntax::mistral;
  } else if (has(source, "<|python_tag|>") || (has(source, "ipython") && has(source, "\"parameters\""))) {
    // Llama 3.1 to 3.3 ask for {"name": ..., "parameters": ...} in the ipython environment.
    f.tools = tool_call_syntax::llama3_json;
  }
  if (has(source, "<think>") || has(source, "</think>")) f.reasoning = reasoning_syntax::think;
  return f;
}

const char* tool_call_syntax_name(tool_call_syntax syntax) {
  switch (syntax) {
    case tool_call_syntax::llama3_json: return "llama3_json";
    case tool_call_syntax::hermes: return "hermes";
    case tool_call_syntax::mistral: return "mistral";
    case tool_call_syntax::harmony: return "openai";
    case tool_call_syntax::none: break;
  }
  return "none";
}

std::optional<tool_call_syntax> parse_tool_call_syntax(std::string_view name) {
  if (name == "none") return tool_call_syntax::none;
  if (name == "llama3_json" || name == "llama3" || name == "llama") return tool_call_syntax::llama3_json;
  if (name == "hermes" || name == "qwen") return tool_call_syntax::hermes;
  if (name == "mistral") return tool_call_syntax::mistral;
  if (name == "openai" || name == "harmony" || name == "gpt-oss") return tool_call_syntax::harmony;
  return std::nullopt;
}

const char* reasoning_syntax_name(reasoning_syntax syntax) {
  switch (syntax) {
    case reasoning_syntax::think: return "think";
    case reasoning_syntax::harmony: return "harmony";
    case reasoning_syntax::none: break;
  }
  return "none";
}

std::optional<reasoning_syntax> parse_reasoning_syntax(std::string_view name) {
  if (name == "none") return reasoning_syntax::none;
  if (name == "think" || name == "qwen3" || name == "deepseek_r1") return reasoning_syntax::think;
  if (name == "harmony" || name == "openai_gptoss" || name == "openai") return reasoning_syntax::harmony;
  return std::nullopt;
}

}  // namespace troupe
