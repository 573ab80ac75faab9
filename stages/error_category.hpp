#pragma once
// The project's errors as a CAF error category: an actor answers, or ends, with
// caf::make_error(error_code::x, "why"), and the same code reaches the client on the wire
// (error_reply, request_failed). The codes are protocol/replies.hpp's error_code; errors cross
// nodes as (code, category, context), so every process that may render one (a node, a remote
// node, the admin client, the tests' systems) registers the category with
// register_error_category. Included only by actors and the node: it pulls in CAF.

#include <cstdint>
#include <optional>
#include <string>

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>
#include <caf/sec.hpp>

#include "protocol/replies.hpp"

// caf::make_error(troupe::error_code::x, ...) makes an error of category "troupe" with code x.
CAF_ERROR_CODE_ENUM(troupe::error_code, "troupe")

namespace troupe {

inline constexpr caf::atom_value error_category = caf::atom("troupe");

// The error's own text: its context when that is one string (what make_error was given), else
// CAF's rendering of the context.
inline std::string error_message(const caf::message& context) {
  if (context.size() == 1 && context.match_element<std::string>(0)) return context.get_as<std::string>(0);
  return context.empty() ? std::string() : caf::to_string(context);
}

// "overloaded: the waiting queue is full (8 requests)": the code's wire name and the message.
// A number this build has no code for (a newer peer's) is shown as the number.
inline std::string render_project_error(uint8_t code, caf::atom_value, const caf::message& context) {
  const std::optional<error_code> known = error_code_from_value(code);
  std::string text = known ? error_code_name(*known) : "error code " + std::to_string(code);
  const std::string message = error_message(context);
  if (!message.empty()) text += ": " + message;
  return text;
}

// Makes `config`'s system render the project's errors by code name (CAF would print
// "error(4, 'troupe', ...)"). Every actor system of the project calls it.
inline void register_error_category(caf::actor_system_config& config) {
  config.add_error_category(error_category, render_project_error);
}

// The wire code an actor's error answer becomes: a project error keeps its code; a request that
// timed out or whose actor is gone (a lost stage or node) is `unavailable` (retry later); any
// other of CAF's is `internal`.
inline error_code wire_code_of(const caf::error& error) {
  if (error.category() == error_category) return error_code_from_value(error.code()).value_or(error_code::internal);
  if (error == caf::sec::request_timeout || error == caf::sec::request_receiver_down) return error_code::unavailable;
  return error_code::internal;
}

}  // namespace troupe
