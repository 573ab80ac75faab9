#pragma once
// What one request of a run measured, on the bench's own clock (the client's view, as users see
// the server): all times in seconds.

#include <string>
#include <vector>

namespace troupe::bench_tool {

struct request_record {
  bool ok = false;
  std::string error;        // why it failed, when !ok
  int prompt_tokens = 0;    // the server's count when it reports one, else the intended length
  int output_tokens = 0;    // the server's count when it reports one, else the streamed tokens
  double start = 0.0;       // when it was sent, from the run's start
  double ttft = 0.0;        // sent -> first streamed output
  double e2e = 0.0;         // sent -> last byte of the reply
  std::vector<double> itl;  // every gap between two streamed chunks with output
  // Speculative decoding, from the server's usage.speculative when it sent one.
  bool speculative = false;
  int draft_tokens = 0;
  int accepted_tokens = 0;
  double tokens_per_step = 0.0;

  // Time per output token after the first; 0 when there is only one.
  double tpot() const { return output_tokens > 1 ? (e2e - ttft) / (output_tokens - 1) : 0.0; }
};

}  // namespace troupe::bench_tool
