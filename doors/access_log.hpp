#pragma once
// The operator's access log: one line per finished request (finished, aborted or failed), built
// where its final reply passes the reply router, from the same record /metrics and the traces
// are fed with (nothing counted twice). Plain functions: an entry, and its two renderings.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "doors/request_admission.hpp"

namespace troupe {

struct access_entry {
  int64_t request_id = 0;
  client_door door = client_door::zmq;
  int num_prompt_tokens = 0;
  int num_output_tokens = 0;
  double ttft_ms = -1;    // -1: no first reply was seen (it failed before)
  double total_ms = -1;   // from entering the stages to its end; -1: its arrival is not known
  std::string finish;     // stop | length | abort | error
  std::string error;      // for finish "error": the error code's name and message
  int32_t instance = -1;  // the engine instance that ended it (traces' and /metrics' id); -1: none
};

// `request 42 door=http prompt=12 output=100 ttft=15.2ms total=410.0ms finish=stop instance=0`
std::string access_log_text(const access_entry& entry);
// The same as fields: request_id, door, prompt_tokens, output_tokens, ttft_ms, total_ms, finish,
// and instance and error where known.
nlohmann::json access_log_fields(const access_entry& entry);

}  // namespace troupe
