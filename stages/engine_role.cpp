#include "stages/engine_role.hpp"

#include <stdexcept>

namespace troupe {

const char* engine_role_name(engine_role role) {
  switch (role) {
    case engine_role::mixed: return "mixed";
    case engine_role::prefill: return "prefill";
    case engine_role::decode: return "decode";
  }
  return "unknown";
}

engine_role parse_engine_role(const std::string& text) {
  if (text == "mixed") return engine_role::mixed;
  if (text == "prefill") return engine_role::prefill;
  if (text == "decode") return engine_role::decode;
  throw std::invalid_argument("engine role '" + text + "' is not mixed, prefill or decode");
}

}  // namespace troupe
