#include "doors/access_log.hpp"

#include <fmt/format.h>

#include "doors/operator_log.hpp"

namespace troupe {

namespace {

// What a refused client sent is echoed in a line an operator reads: bounded, and quoted so a
// newline or a quote in it cannot forge a line or a field.
constexpr size_t max_client_id_chars = 128;
constexpr size_t max_message_chars = 512;

std::string clipped(const std::string& text, size_t most) {
  return text.size() <= most ? text : text.substr(0, most) + "...";
}

std::string quoted(const std::string& text, size_t most) {
  return nlohmann::json(clipped(text, most)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string access_log_text(const access_entry& e) {
  std::string line = fmt::format("request {} door={} prompt={} output={}", e.request_id, client_door_name(e.door),
                                 e.num_prompt_tokens, e.num_output_tokens);
  if (e.ttft_ms >= 0) line += fmt::format(" ttft={:.1f}ms", e.ttft_ms);
  if (e.total_ms >= 0) line += fmt::format(" total={:.1f}ms", e.total_ms);
  line += " finish=" + e.finish;
  if (e.instance >= 0) line += fmt::format(" instance={}", e.instance);
  if (!e.error.empty()) line += " error=\"" + e.error + "\"";
  return line;
}

nlohmann::json access_log_fields(const access_entry& e) {
  nlohmann::json fields = {{"request_id", e.request_id},
                           {"door", client_door_name(e.door)},
                           {"prompt_tokens", e.num_prompt_tokens},
                           {"output_tokens", e.num_output_tokens},
                           {"finish", e.finish}};
  if (e.ttft_ms >= 0) fields["ttft_ms"] = e.ttft_ms;
  if (e.total_ms >= 0) fields["total_ms"] = e.total_ms;
  if (e.instance >= 0) fields["instance"] = e.instance;
  if (!e.error.empty()) fields["error"] = e.error;
  return fields;
}

std::string refusal_log_text(const refusal_entry& e) {
  std::string line = fmt::format("refused door={}", client_door_name(e.door));
  if (e.http_status > 0) line += fmt::format(" status={}", e.http_status);
  if (!e.path.empty()) line += " path=" + quoted(e.path, max_client_id_chars);
  line += " code=" + e.code;
  if (!e.client_id.empty()) line += " id=" + quoted(e.client_id, max_client_id_chars);
  line += " error=" + quoted(e.message, max_message_chars);
  return line;
}

nlohmann::json refusal_log_fields(const refusal_entry& e) {
  nlohmann::json fields = {{"door", client_door_name(e.door)},
                           {"finish", "refused"},
                           {"code", e.code},
                           {"error", clipped(e.message, max_message_chars)}};
  if (!e.client_id.empty()) fields["client_id"] = clipped(e.client_id, max_client_id_chars);
  if (e.http_status > 0) fields["http_status"] = e.http_status;
  if (!e.path.empty()) fields["path"] = clipped(e.path, max_client_id_chars);
  return fields;
}

void log_refusal(const refusal_entry& entry) {
  emit_structured("access", refusal_log_text(entry), refusal_log_fields(entry));
}

}  // namespace troupe
