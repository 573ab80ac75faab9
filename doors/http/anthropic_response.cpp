#include "doors/http/anthropic_response.hpp"

#include "doors/http/chat_plan.hpp"
#include "doors/http/server_sent_events.hpp"

namespace troupe {

namespace {

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;

std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

// A call's input as an object, its keys in the model's order.
ordered input_of(const parsed_tool_call& call) {
  ordered input = ordered::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : ordered::object();
}

const char* error_type(const api_error& e) {
  if (e.status == 401) return "authentication_error";
  if (e.status == 404) return "not_found_error";
  if (e.status == 413) return "request_too_large";
  if (e.status == 429) return "rate_limit_error";
  if (e.status == 503) return "overloaded_error";
  if (e.status >= 500) return "api_error";
  return "invalid_request_error";
}

}  // namespace

const char* anthropic_stop_reason(const std::string& finish_reason) {
  if (finish_reason == "length") return "max_tokens";
  if (finish_reason == "tool_calls") return "tool_use";
  return "end_turn";
}

std::string anthropic_error_json(const api_error& error) {
  return dump(json{{"type", "error"}, {"error", {{"type", error_type(error)}, {"message", error.message}}}});
}

anthropic_response_builder::anthropic_response_builder(std::string model, std::string id, tool_call_syntax id_syntax,
                                                       uint64_t id_seed)
    : model_(std::move(model)), id_(std::move(id)), id_syntax_(id_syntax), id_seed_(id_seed) {}

// The input keeps the model's key order, in the whole message as in the streamed one.
ordered anthropic_response_builder::tool_use(const parsed_tool_call& call) {
  std::string id = tool_call_id(id_syntax_, id_seed_, num_calls_++);
  // Anthropic's ids read "toolu_..."; Mistral's templates need theirs as they are (9 characters).
  if (id.rfind("call_", 0) == 0) id = "toolu_" + id.substr(5);
  ordered block = ordered::object();
  block["type"] = "tool_use";
  block["id"] = id;
  block["name"] = call.name;
  block["input"] = input_of(call);
  return block;
}

std::string anthropic_response_builder::body(const std::vector<choice_output>& choices, const usage_counts& usage) {
  const choice_output& c = choices.at(0);
  ordered content = ordered::array();
  if (!c.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", c.reasoning}, {"signature", ""}});
  if (!c.text.empty() || c.tool_calls.empty()) content.push_back({{"type", "text"}, {"text", c.text}});
  for (const auto& call : c.tool_calls) content.push_back(tool_use(call));
  // Keys in the order Anthropic writes them; the content keeps its blocks' order.
  ordered message = ordered::object();
  message["id"] = id_;
  message["type"] = "message";
  message["role"] = "assistant";
  message["model"] = model_;
  message["content"] = std::move(content);
  message["stop_reason"] = anthropic_stop_reason(c.finish_reason.value_or("stop"));
  message["stop_sequence"] = nullptr;
  message["usage"] = {{"input_tokens", usage.prompt_tokens}, {"output_tokens", usage.completion_tokens}};
  return message.dump(-1, ' ', false, ordered::error_handler_t::replace);
}

std::string anthropic_response_builder::start_message() {
  if (started_) return {};
  started_ = true;
  const json message = {{"id", id_},
                        {"type", "message"},
                        {"role", "assistant"},
                        {"model", model_},
                        {"content", json::array()},
                        {"stop_reason", nullptr},
                        {"stop_sequence", nullptr},
                        {"usage", {{"input_tokens", 0}, {"output_tokens", 0}}}};
  return sse::named_event("message_start", dump({{"type", "message_start"}, {"message", message}}));
}

std::string anthropic_response_builder::close() {
  if (open_ == block::none) return {};
  std::string out;
  if (open_ == block::thinking) {
    // A signature ends every thinking block Anthropic streams; this server signs nothing.
    out += sse::named_event("content_block_delta", dump({{"type", "content_block_delta"},
                                                         {"index", index_},
                                                         {"delta", {{"type", "signature_delta"}, {"signature", ""}}}}));
  }
  open_ = block::none;
  return out + sse::named_event("content_block_stop", dump({{"type", "content_block_stop"}, {"index", index_}}));
}

std::string anthropic_response_builder::open(block kind) {
  if (open_ == kind) return {};
  std::string out = close();
  open_ = kind;
  ++index_;
  const json block =
      kind == block::thinking ? json{{"type", "thinking"}, {"thinking", ""}} : json{{"type", "text"}, {"text", ""}};
  return out + sse::named_event("content_block_start",
                                dump({{"type", "content_block_start"}, {"index", index_}, {"content_block", block}}));
}

std::string anthropic_response_builder::events(int, const choice_output& piece) {
  std::string out = start_message();
  if (!piece.reasoning.empty()) {
    out += open(block::thinking);
    out += sse::named_event("content_block_delta",
                            dump({{"type", "content_block_delta"},
                                  {"index", index_},
                                  {"delta", {{"type", "thinking_delta"}, {"thinking", piece.reasoning}}}}));
  }
  if (!piece.text.empty()) {
    out += open(block::text);
    out += sse::named_event("content_block_delta", dump({{"type", "content_block_delta"},
                                                         {"index", index_},
                                                         {"delta", {{"type", "text_delta"}, {"text", piece.text}}}}));
  }
  for (const auto& call : piece.tool_calls) {
    out += close();
    ++index_;
    ordered start = tool_use(call);
    const std::string input = start["input"].dump(-1, ' ', false, ordered::error_handler_t::replace);
    start["input"] = ordered::object();  // the input comes as JSON text in deltas, as Anthropic streams it
    ordered event = ordered::object();
    event["type"] = "content_block_start";
    event["index"] = index_;
    event["content_block"] = std::move(start);
    out += sse::named_event("content_block_start", event.dump(-1, ' ', false, ordered::error_handler_t::replace));
    out += sse::named_event("content_block_delta",
                            dump({{"type", "content_block_delta"},
                                  {"index", index_},
                                  {"delta", {{"type", "input_json_delta"}, {"partial_json", input}}}}));
    out += sse::named_event("content_block_stop", dump({{"type", "content_block_stop"}, {"index", index_}}));
  }
  if (piece.finish_reason) stop_reason_ = anthropic_stop_reason(*piece.finish_reason);
  return out;
}

std::string anthropic_response_builder::end(const usage_counts& usage) {
  std::string out = start_message();
  out += close();
  out += sse::named_event(
      "message_delta",
      dump({{"type", "message_delta"},
            {"delta", {{"stop_reason", stop_reason_}, {"stop_sequence", nullptr}}},
            {"usage", {{"input_tokens", usage.prompt_tokens}, {"output_tokens", usage.completion_tokens}}}}));
  return out + sse::named_event("message_stop", dump({{"type", "message_stop"}}));
}

std::string anthropic_response_builder::failure(const api_error& error) {
  return sse::named_event("error", anthropic_error_json(error));
}

}  // namespace troupe
