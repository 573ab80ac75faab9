#include "doors/http/chat_request.hpp"

namespace troupe {

using json = nlohmann::ordered_json;

json tools_for_template(const std::vector<chat_tool>& tools) {
  json list = json::array();
  for (const chat_tool& tool : tools) {
    json function = json::object();
    function["name"] = tool.name;
    if (!tool.description.empty()) function["description"] = tool.description;
    function["parameters"] =
        tool.parameters.empty() ? json{{"type", "object"}, {"properties", json::object()}} : tool.parameters;
    list.push_back(json{{"type", "function"}, {"function", std::move(function)}});
  }
  return list;
}

}  // namespace troupe
