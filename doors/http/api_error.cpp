#include "doors/http/api_error.hpp"

#include <nlohmann/json.hpp>

#include "protocol/service_targets.hpp"

namespace troupe {

std::string api_error::to_json() const {
  nlohmann::json error = {{"message", message},
                          {"type", type},
                          {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                          {"code", code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code)}};
  return nlohmann::json{{"error", error}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

api_error bad_parameter(std::string param, std::string message) {
  api_error e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

api_error from_engine_error(error_code code, const std::string& message, const std::string& prompt_param) {
  api_error e;
  e.message = message;
  switch (code) {
    case error_code::bad_request: e.status = 400; break;
    case error_code::prompt_too_long:
      e.status = 400;
      e.param = prompt_param;
      e.code = "context_length_exceeded";
      break;
    case error_code::unauthorized:
      e.status = 401;
      e.code = "invalid_api_key";
      break;
    case error_code::not_found:
      e.status = 404;
      e.type = "not_found_error";
      break;
    case error_code::overloaded:
      // The scheduler's waiting queue is full: the server, not this client, is at its limit.
      e.status = 503;
      e.type = "overloaded_error";
      break;
    case error_code::slo_unattainable:
      // The slo policy refused it early: too many requests ahead for the target this client
      // asked, which a later or laxer request may meet.
      e.status = 429;
      e.type = "overloaded_error";
      e.code = "slo_unattainable";
      break;
    case error_code::unavailable:
      // No engine instance is left to serve (lost or draining): the server's state, not a fault
      // in the request, and /health answers 503 meanwhile.
      e.status = 503;
      e.type = "service_unavailable_error";
      break;
    case error_code::duplicate_id:
    case error_code::internal:
      e.status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

}  // namespace troupe
