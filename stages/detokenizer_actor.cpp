#include <spdlog/spdlog.h>

#include "stages/detokenize_stage.hpp"
#include "engine/served_model.hpp"
#include "stages/message_inspect.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

namespace {
// What a token batch's sender must take back: the router's and a scheduler's interfaces both do.
using stop_taker_handle = caf::typed_actor<caf::reacts_to<stop_request_msg>>;
}  // namespace

detokenizer_handle::behavior_type detokenizer_actor(detokenizer_handle::pointer self,
                                                    std::shared_ptr<detokenize_stage> stage, frontend_handle frontend) {
  keep_exception_in_exit_reason(self);
  return instrumented(
      self, "detokenizer",
      {
          [=](token_batch& batch) {
            auto out = stage->run(std::move(batch));
            if (!out.texts.deltas.empty()) self->send(frontend, std::move(out.texts));
            for (auto& failure : out.failures) self->send(frontend, std::move(failure));
            if (out.stopped_ids.empty()) return;
            // The batch's sender (the router, which passes the stop to the scheduler that owns the
            // request; or a scheduler itself, as in the runtime bench): its final delta for each
            // releases the text the stage holds.
            auto owner = caf::actor_cast<stop_taker_handle>(self->current_sender());
            if (!owner) {
              spdlog::error(
                  "detokenizer: a token batch without a sender matched stop strings; its requests cannot finish");
              return;
            }
            for (int64_t id : out.stopped_ids) self->send(owner, stop_request_msg{id});
          },
          // From the router, before the deltas of a request it takes over from a lost detokenizer.
          [=](detokenizer_resume_msg& resume) { stage->resume(resume); },
          [](stage_failure_drill& drill) { fail_for_drill(drill.reason); },
          [](loaded_atom) { return true; },
      });
}

detokenizer_handle::behavior_type detokenizer_actor_from_spec(detokenizer_handle::pointer self, detokenizer_spec spec) {
  keep_exception_in_exit_reason(self);
  spec.validate();
  quit_with(self, spec.reply_to);  // its text has nowhere to go once the controller is gone
  std::shared_ptr<detokenize_stage> stage;
  try {
    auto plugins = std::make_shared<plugin_chain>(spec.plugins, "output");
    register_plugins(self->system(), "detokenizer", plugins);
    stage = std::make_shared<detokenize_stage>(std::move(*load_model_tokenizer(spec.tokenizer_path)), plugins);
  } catch (const std::exception& e) {
    return refused_placement(self, "detokenizer", e.what());
  }
  return detokenizer_actor(self, std::move(stage), std::move(spec.reply_to));
}

}  // namespace troupe
