#include "engine/served_model.hpp"
#include "stages/message_inspect.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/stage_actors.hpp"
#include "stages/tokenize_stage.hpp"

namespace troupe {

tokenizer_handle::behavior_type tokenizer_actor(tokenizer_handle::pointer self,
                                                std::shared_ptr<const tokenize_stage> stage, router_handle router,
                                                frontend_handle frontend) {
  keep_exception_in_exit_reason(self);
  return instrumented(self, "tokenizer",
                      {
                          [=](tokenize_request& request) {
                            auto result = stage->run(std::move(request));
                            if (auto* ready = std::get_if<schedule_request>(&result)) {
                              self->send(router, std::move(*ready));
                            } else {
                              self->send(frontend, std::move(std::get<request_failed>(result)));
                            }
                          },
                          [](stage_failure_drill& drill) { fail_for_drill(drill.reason); },
                          [](loaded_atom) { return true; },
                      });
}

tokenizer_handle::behavior_type tokenizer_actor_from_spec(tokenizer_handle::pointer self, tokenizer_spec spec) {
  keep_exception_in_exit_reason(self);
  spec.validate();
  quit_with(self, spec.router);  // a tokenizer without its controller's router serves no one
  std::shared_ptr<const tokenize_stage> stage;
  try {
    auto plugins = std::make_shared<plugin_chain>(spec.plugins, "request");
    register_plugins(self->system(), "tokenizer", plugins);
    stage = std::make_shared<const tokenize_stage>(std::move(*load_model_tokenizer(spec.tokenizer_path)),
                                                   spec.vocab_size, spec.max_model_len, plugins);
  } catch (const std::exception& e) {
    return refused_placement(self, "tokenizer", e.what());
  }
  return tokenizer_actor(self, std::move(stage), std::move(spec.router), std::move(spec.reply_to));
}

}  // namespace troupe
