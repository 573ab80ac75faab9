// The project's errors as a CAF error category (stages/error_category.hpp): an error made from an
// error_code crosses a process boundary (CAF's binary serializer, as between nodes) and is
// rendered on the other side by its wire name and message; an actor's error answer maps to the
// wire code it carries; an exception escaping a stage's handler ends the stage with `internal`.

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/sec.hpp>
#include <caf/send.hpp>

#include "stages/error_category.hpp"
#include "stages/message_inspect.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {
namespace {

struct category_config : caf::actor_system_config {
  category_config() {
    set("logger.console", caf::atom("none"));
    register_error_category(*this);
  }
};

// Writes `error` with `from`'s serializer and reads it back with `to`'s deserializer.
caf::error carried(caf::actor_system& from, caf::actor_system& to, caf::error error) {
  std::vector<char> buf;
  caf::binary_serializer sink{from, buf};
  if (auto failed = sink(error)) ADD_FAILURE() << "serializing: " << from.render(failed);
  caf::error out;
  caf::binary_deserializer source{to, buf};
  if (auto failed = source(out)) ADD_FAILURE() << "deserializing: " << to.render(failed);
  EXPECT_EQ(source.remaining(), 0u) << "bytes left over";
  return out;
}

TEST(error_category, every_code_crosses_a_process_and_is_rendered_there_by_its_wire_name) {
  category_config sender_config;
  caf::actor_system sender{sender_config};
  category_config receiver_config;
  caf::actor_system receiver{receiver_config};
  int num_codes = 0;
  for (int value = 0; value < 256; ++value) {
    const std::optional<error_code> code = error_code_from_value(value);
    if (!code) continue;
    ++num_codes;
    const std::string name = error_code_name(*code);
    SCOPED_TRACE(name);
    const caf::error original = caf::make_error(*code, "why " + name);
    ASSERT_TRUE(original) << "a code CAF reads as no error";
    const caf::error read = carried(sender, receiver, original);
    EXPECT_EQ(read.category(), error_category);
    EXPECT_EQ(read.code(), value);
    EXPECT_EQ(receiver.render(read), name + ": why " + name);
    EXPECT_EQ(wire_code_of(read), *code);
  }
  EXPECT_EQ(num_codes, 9) << "a code added to protocol/replies.hpp belongs in error_code_from_value";
  EXPECT_EQ(error_code_from_value(0), std::nullopt) << "CAF reads code 0 as no error";
}

// What an actor's error answer becomes on the wire: a project error keeps its code; CAF's own
// are `unavailable` when the actor timed out or is gone, else `internal`; a number this build
// has no code for (a newer peer's) is `internal` and rendered as the number.
TEST(error_category, an_answer_maps_to_the_wire_code_it_carries) {
  category_config config;
  caf::actor_system system{config};
  EXPECT_EQ(wire_code_of(caf::make_error(error_code::overloaded, "full")), error_code::overloaded);
  EXPECT_EQ(wire_code_of(caf::make_error(error_code::bad_request)), error_code::bad_request);
  EXPECT_EQ(wire_code_of(caf::make_error(caf::sec::request_timeout)), error_code::unavailable);
  EXPECT_EQ(wire_code_of(caf::make_error(caf::sec::request_receiver_down)), error_code::unavailable);
  EXPECT_EQ(wire_code_of(caf::make_error(caf::sec::unexpected_message)), error_code::internal);
  EXPECT_EQ(wire_code_of(caf::make_error(caf::exit_reason::kill)), error_code::internal);
  const caf::error unknown{uint8_t{200}, error_category, caf::make_message(std::string("from a newer peer"))};
  EXPECT_EQ(wire_code_of(unknown), error_code::internal);
  EXPECT_EQ(system.render(unknown), "error code 200: from a newer peer");
  EXPECT_EQ(system.render(caf::make_error(error_code::unavailable)), "unavailable");
}

// A stage's error answers travel to the asker as the project's errors: the one a request gets is
// the one the actor made, code and message.
TEST(error_category, an_actor_answers_with_a_project_error_that_its_asker_receives_whole) {
  category_config config;
  caf::actor_system system{config};
  auto refusing = system.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](int32_t n) -> caf::result<int32_t> {
      return caf::make_error(error_code::slo_unattainable, "request " + std::to_string(n) + ": too late");
    }};
  });
  caf::scoped_actor self{system};
  std::optional<caf::error> got;
  self->request(refusing, std::chrono::seconds(10), int32_t{7})
      .receive([&](int32_t) { ADD_FAILURE() << "answered"; }, [&](caf::error& error) { got = std::move(error); });
  ASSERT_TRUE(got);
  EXPECT_EQ(wire_code_of(*got), error_code::slo_unattainable);
  EXPECT_EQ(error_message(got->context()), "request 7: too late");
  EXPECT_EQ(system.render(*got), "slo_unattainable: request 7: too late");
  self->send_exit(refusing, caf::exit_reason::user_shutdown);
}

// The last guard: a bug that throws out of a stage's handler ends the stage with an `internal`
// error naming the exception, which the node's monitor renders into what each client is told.
TEST(error_category, an_exception_out_of_a_stage_handler_ends_it_with_internal_and_the_message) {
  category_config config;
  caf::actor_system system{config};
  auto stage = system.spawn([](caf::event_based_actor* self) -> caf::behavior {
    keep_exception_in_exit_reason(self);
    return {[](int32_t) { throw std::runtime_error("the plan names an unknown request"); }};
  });
  caf::scoped_actor self{system};
  self->monitor(stage);
  self->send(stage, int32_t{1});
  std::optional<caf::error> reason;
  self->receive([&](caf::down_msg& down) { reason = down.reason; });
  ASSERT_TRUE(reason);
  EXPECT_EQ(reason->category(), error_category);
  EXPECT_EQ(wire_code_of(*reason), error_code::internal);
  EXPECT_EQ(system.render(*reason), "internal: the plan names an unknown request");
}

// A request_failed from another node carries its code as a number: one the wire has no name for
// is refused as it is read, so no client is sent a code it cannot parse.
TEST(error_category, a_request_failed_with_an_unknown_code_is_refused_when_read) {
  category_config config;
  caf::actor_system system{config};
  request_failed bad{42, static_cast<error_code>(77), "from a confused peer"};
  std::vector<char> buf;
  caf::binary_serializer sink{system, buf};
  ASSERT_FALSE(sink(bad));
  request_failed out;
  caf::binary_deserializer source{system, buf};
  const caf::error error = source(out);
  ASSERT_TRUE(error);
  EXPECT_EQ(wire_code_of(error), error_code::bad_request);
  EXPECT_EQ(system.render(error), "bad_request: request_failed: error code 77 is not one the wire knows");
}

}  // namespace
}  // namespace troupe
