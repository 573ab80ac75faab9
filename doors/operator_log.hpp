#pragma once
// How the process's log lines are written: as text (spdlog's pattern), or with --log-format json
// as one JSON object per line, every line, so a log collector parses them without patterns:
//
//   {"time":"2026-11-28T04:30:00.123Z","level":"info","msg":"serving: ..."}
//   {"time":...,"level":"info","event":"access","msg":"request 42 ...","request_id":42,...}
//
// Structured lines (the access log, the throughput line) are logged through emit_structured: as
// their text in text mode; in JSON mode their fields stand at the line's top level beside
// "event" (the kind of line) and "msg" (the same text), so both modes carry the same words.

#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/formatter.h>

namespace troupe {

enum class log_format { text, json };

// Sets the format of every logger's sinks, the default one's and those made later by
// emit_structured. Call once at start-up, before other threads log.
void set_log_format(log_format format);
log_format current_log_format();
// "text" | "json"; throws std::invalid_argument naming the value and what was expected.
log_format parse_log_format(const std::string& name);

// One structured line of kind `event` ("access", "throughput") at level info.
void emit_structured(const std::string& event, const std::string& text, const nlohmann::json& fields);

// The JSON formatter itself (set_log_format installs it), for its test.
class json_log_formatter : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override;
  std::unique_ptr<spdlog::formatter> clone() const override;
};

}  // namespace troupe
