#pragma once
// What a request asks of the scheduler beyond its tokens: whose it is (the fair policy shares the
// engine among tenants) and how fast it must be served (the slo policy's targets). Carried from
// the doors (OpenAI extra fields `slo` and the API key's name; ZeroMQ fields) to the sequence.

#include <string>

namespace troupe {

struct service_targets {
  std::string tenant;  // "" : the anonymous tenant
  double ttft_ms = 0;  // time to first token target, from arrival; 0: none
  double tpot_ms = 0;  // time per output token target, between tokens; 0: none
};

}  // namespace troupe
