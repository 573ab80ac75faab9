#pragma once
// A chat as the doors read it, whichever API it came through (OpenAI's chat completions,
// Anthropic's messages): the conversation in the shape chat templates read, the tools the model
// may call and how it must choose among them, and the template's extra variables. What the door
// then does with it is in chat_plan.hpp.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe {

enum class tool_choice_kind { none, automatic, required, function };

struct chat_tool {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();  // JSON schema; {}: any object
};

struct chat_request {
  // [{role, content, ...}]: content a string ("" for an assistant turn that only called tools);
  // an assistant's tool_calls as [{id, type: "function", function: {name, arguments}}] with the
  // arguments as a JSON object (what templates write with tojson), a tool result's tool_call_id,
  // an earlier turn's reasoning_content.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::vector<chat_tool> tools;
  tool_choice_kind tool_choice = tool_choice_kind::automatic;  // none when there are no tools
  std::string tool_choice_name;                                // tool_choice function
  bool parallel_tool_calls = true;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
  std::string reasoning_effort;                                               // "" when not given
  // The field names of the API it came through, for errors ("tools" / "tool_choice").
  std::string tools_param = "tools";
  std::string tool_choice_param = "tool_choice";

  bool calls_tools() const { return !tools.empty() && tool_choice != tool_choice_kind::none; }
};

// The tools as templates read them: [{"type": "function", "function": {name, description, parameters}}].
nlohmann::ordered_json tools_for_template(const std::vector<chat_tool>& tools);

}  // namespace troupe
