#include "doors/operator_log.hpp"

#include <atomic>
#include <chrono>
#include <ctime>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

namespace troupe {

namespace {

std::atomic<log_format> format_in_use{log_format::text};

// Structured lines are logged as their fields' JSON with this marker before it, so the JSON
// formatter tells them from a message that merely starts with '{'.
constexpr std::string_view structured_marker = "\x1e";

std::string utc_time(std::chrono::system_clock::time_point at) {
  const auto since_epoch = at.time_since_epoch();
  const std::time_t seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() % 1000;
  std::tm parts{};
  gmtime_r(&seconds, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &parts);
  return fmt::format("{}.{:03d}Z", text, static_cast<int>(millis));
}

// One logger per kind of structured line, sharing the default logger's sinks (and so its
// formatter and destination); made on first use, and again when the default logger was replaced
// (a test's), so that none writes to a sink that is gone.
std::shared_ptr<spdlog::logger> structured_logger(const std::string& event) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::shared_ptr<spdlog::logger>> loggers;
  const std::shared_ptr<spdlog::logger> base = spdlog::default_logger();
  std::lock_guard lock(mutex);
  auto& logger = loggers[event];
  if (!logger || logger->sinks() != base->sinks()) {
    auto made = std::make_shared<spdlog::logger>(event, base->sinks().begin(), base->sinks().end());
    made->set_level(spdlog::level::info);  // they are what an operator asked for: above --log-level's filter
    logger = made;
  }
  return logger;
}

}  // namespace

void json_log_formatter::format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) {
  const std::string_view payload(msg.payload.data(), msg.payload.size());
  nlohmann::ordered_json line;
  line["time"] = utc_time(msg.time);
  line["level"] =
      std::string(spdlog::level::to_string_view(msg.level).data(), spdlog::level::to_string_view(msg.level).size());
  if (payload.substr(0, structured_marker.size()) == structured_marker) {
    line["event"] = std::string(msg.logger_name.data(), msg.logger_name.size());
    const nlohmann::json fields = nlohmann::json::parse(payload.substr(structured_marker.size()), nullptr, false);
    if (fields.is_object()) {
      for (const auto& [key, value] : fields.items()) line[key] = value;
    }
  } else {
    line["msg"] = std::string(payload);
  }
  // Replacement of bad UTF-8 (a message quoting a client's bytes) keeps the line valid JSON.
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  dest.append(text.data(), text.data() + text.size());
  dest.push_back('\n');
}

std::unique_ptr<spdlog::formatter> json_log_formatter::clone() const { return std::make_unique<json_log_formatter>(); }

void set_log_format(log_format format) {
  format_in_use = format;
  if (format == log_format::json) {
    spdlog::set_formatter(std::make_unique<json_log_formatter>());
  } else {
    spdlog::set_formatter(std::make_unique<spdlog::pattern_formatter>());
  }
}

log_format current_log_format() { return format_in_use; }

log_format parse_log_format(const std::string& name) {
  if (name == "text") return log_format::text;
  if (name == "json") return log_format::json;
  throw std::invalid_argument("log format '" + name + "': expected text or json");
}

void emit_structured(const std::string& event, const std::string& text, const nlohmann::json& fields) {
  auto logger = structured_logger(event);
  if (format_in_use == log_format::json) {
    nlohmann::json with_text = fields;
    with_text["msg"] = text;
    logger->info("{}{}", structured_marker, with_text.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    logger->info("{}", text);
  }
}

}  // namespace troupe
