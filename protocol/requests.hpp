#pragma once
// What a client sends on the ZeroMQ plane (docs/protocol.md), decoded and validated.

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "protocol/sampling_params.hpp"
#include "protocol/service_targets.hpp"

namespace troupe {

struct chat_message {
  std::string role;
  std::string content;
};

// Exactly one of prompt, prompt_token_ids and messages is set.
struct generate_request {
  std::string id;
  std::optional<std::string> prompt;
  std::optional<std::vector<int32_t>> prompt_token_ids;
  std::optional<std::vector<chat_message>> messages;
  sampling_params sampling;
  bool stream = true;       // false: one reply with the whole completion
  int priority = 0;         // lower runs first among waiting requests; ties in arrival order
  service_targets targets;  // `tenant` and `slo: {ttft_ms, tpot_ms}`
  std::string api_key;
};

struct abort_request {
  std::string id;
  std::string api_key;
};

// Asks for the engine's counters (free KV blocks, running and waiting requests).
struct stats_request {
  std::string id;
  std::string api_key;
};

using client_request = std::variant<generate_request, abort_request, stats_request>;

}  // namespace troupe
