#pragma once
// How a model writes tool calls and reasoning, read from its chat template: the template shows
// the model its tools and past calls in the syntax it was trained on, so the same syntax is what
// its answers use. The families:
//
//   tool calls   llama3_json  {"name": "f", "parameters": {...}}  (optionally after <|python_tag|>)
//                hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>  (Qwen2.5, Qwen3)
//                mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]
//                harmony      <|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}  (gpt-oss)
//   reasoning    think        <think>...</think> before the answer (Qwen3, DeepSeek-R1)
//                harmony      the analysis channel before the final one (gpt-oss)

#include <optional>
#include <string>
#include <string_view>

namespace troupe {

enum class tool_call_syntax { none, llama3_json, hermes, mistral, harmony };
enum class reasoning_syntax { none, think, harmony };

struct chat_format {
  tool_call_syntax tools = tool_call_syntax::none;
  reasoning_syntax reasoning = reasoning_syntax::none;
};

// The family a template belongs to, from the markers it writes; none where it writes none.
chat_format detect_chat_format(std::string_view template_source);

// vLLM's names where it has one: "llama3_json", "hermes", "mistral", "openai" (harmony), "none".
const char* tool_call_syntax_name(tool_call_syntax syntax);
std::optional<tool_call_syntax> parse_tool_call_syntax(std::string_view name);
// "think" (also "qwen3", "deepseek_r1"), "harmony" (also "openai_gptoss"), "none".
const char* reasoning_syntax_name(reasoning_syntax syntax);
std::optional<reasoning_syntax> parse_reasoning_syntax(std::string_view name);

}  // namespace troupe
