#include "stages/message_inspect.hpp"
#include "stages/stage_actors.hpp"
#include "stages/tokenize_stage.hpp"

namespace troupe {

caf::behavior tokenizer_actor(caf::event_based_actor* self, std::shared_ptr<const tokenize_stage> stage,
                              caf::actor scheduler, caf::actor frontend) {
  keep_exception_in_exit_reason(self);
  return {
      [=](tokenize_request& request) {
        auto result = stage->run(std::move(request));
        if (auto* ready = std::get_if<schedule_request>(&result)) {
          self->send(scheduler, std::move(*ready));
        } else {
          self->send(frontend, std::move(std::get<request_failed>(result)));
        }
      },
      [](stage_failure_drill& drill) { fail_for_drill(drill.reason); },
  };
}

}  // namespace troupe
