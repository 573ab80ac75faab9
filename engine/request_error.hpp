#pragma once
// Why a request was refused at the door. Errors are values here: the scheduler runs inside an
// actor, and a refused request is an answer to the client, not an exception. The code is the
// wire's (protocol/replies.hpp), so a refusal reaches the client with the scheduler's own code.

#include <string>

#include "protocol/replies.hpp"

namespace troupe {

// The scheduler's refusals use overloaded (the waiting queue is full), slo_unattainable (the slo
// policy predicts the TTFT target cannot be met behind this queue), bad_request (the request can
// never run: empty prompt, too long, bad parameters) and duplicate_id (a live request has the id).
struct request_error {
  error_code code;
  std::string message;
};

}  // namespace troupe
