#include "doors/access_log.hpp"

#include <fmt/format.h>

namespace troupe {

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

}  // namespace troupe
