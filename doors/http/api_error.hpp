#pragma once
// An error as OpenAI's API reports it: an HTTP status and
// {"error": {"message", "type", "param", "code"}}. param names the request field at fault.

#include <string>

#include "protocol/replies.hpp"

namespace troupe {

struct api_error {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // empty: null
  std::string code;   // empty: null

  std::string to_json() const;
};

api_error bad_parameter(std::string param, std::string message);
// An engine-side failure (tokenizer, scheduler, worker) of one request, as the client sees it.
api_error from_engine_error(error_code code, const std::string& message, const std::string& prompt_param);

}  // namespace troupe
