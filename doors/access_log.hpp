#pragma once
// The operator's access log: one line per finished request (finished, aborted or failed), built
// where its final reply passes the reply router, from the same record /metrics and the traces
// are fed with (nothing counted twice), and one per request a door refused before it entered the
// stages (malformed, unauthorized, over a bound, the server draining), logged by that door.
// Plain functions: an entry, and its two renderings.

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

// A request refused at a door: it has no request id yet, so the client's own id names it.
struct refusal_entry {
  client_door door = client_door::zmq;
  std::string client_id;  // as the client gave it; empty when it could not be read
  std::string code;       // the wire error code's name (ZeroMQ) or the API error's type (HTTP)
  int http_status = 0;    // 0 for ZeroMQ
  std::string message;    // why, as the client was told
  std::string path;       // the HTTP door's path ("/v1/chat/completions"); empty for ZeroMQ
};

// `refused door=http status=401 path="/v1/completions" code=invalid_request_error error="incorrect API key provided"`
// `refused door=zmq code=overloaded id="c-7" error="the server holds ..."`
// The client's id and the message are quoted and escaped (they may hold what the client sent) and
// cut to a bounded length.
std::string refusal_log_text(const refusal_entry& entry);
// door, finish ("refused"), code, error, and client_id, http_status and path where known.
nlohmann::json refusal_log_fields(const refusal_entry& entry);
// Writes the entry as an access line (operator_log.hpp's emit_structured, event "access").
void log_refusal(const refusal_entry& entry);

}  // namespace troupe
