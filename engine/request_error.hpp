#pragma once
// Why a request was refused at the door. Errors are values here: the scheduler runs inside an
// actor, and a refused request is an answer to the client, not an exception.

#include <string>

namespace troupe {

enum class request_error_code {
  overloaded,        // the waiting queue is full: retry later or elsewhere
  slo_unattainable,  // the slo policy predicts the request's TTFT target cannot be met behind this queue
  invalid_request,   // the request can never run (empty prompt, too long, bad parameters)
  duplicate_id,      // a live request already has this id
};

struct request_error {
  request_error_code code;
  std::string message;
};

}  // namespace troupe
