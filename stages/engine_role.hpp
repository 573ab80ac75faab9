#pragma once
// An engine instance as the router names it: its id, whether it takes new requests, and its
// role in a disaggregated topology. Shared by the router (stages/engine_router.hpp) and the
// routing policies it consults (stages/route_policy.hpp).

#include <cstdint>
#include <string>

namespace troupe {

using engine_instance_id = int32_t;

enum class engine_state : uint8_t { active, draining };

enum class engine_role : uint8_t { mixed, prefill, decode };
const char* engine_role_name(engine_role role);
// "mixed", "prefill" or "decode"; throws std::invalid_argument naming the text otherwise.
engine_role parse_engine_role(const std::string& text);

}  // namespace troupe
