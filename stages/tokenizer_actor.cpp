#include "engine/served_model.hpp"
#include "stages/message_inspect.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/stage_actors.hpp"
#include "stages/shared_tokenize_stages.hpp"
#include "stages/tokenize_stage.hpp"

namespace troupe {

namespace {

// The tokenizers of this process, by what they are made of (stages/shared_tokenize_stages.hpp).
shared_tokenize_stages& shared_stages() {
  static shared_tokenize_stages stages;
  return stages;
}

// What a tokenizer spec's stage is made of, in one actor system (a test may run several, each
// with its own plugin counters): everything in the spec but where its messages go.
std::string stage_key(const caf::actor_system& system, const tokenizer_spec& spec) {
  constexpr char separator = '\x1f';
  std::string key = std::to_string(reinterpret_cast<uintptr_t>(&system)) + separator + spec.tokenizer_path + separator +
                    std::to_string(spec.vocab_size) + separator + std::to_string(spec.max_model_len);
  for (const plugin_spec& p : spec.plugins) {
    key +=
        '\x1e' + p.name + separator + p.library + separator + p.config_json + separator + std::to_string(p.budget_ms);
    for (const std::string& hook : p.hooks) key += separator + hook;
  }
  return key;
}

}  // namespace

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
    stage = shared_stages().get(stage_key(self->system(), spec), [&] {
      auto plugins = std::make_shared<plugin_chain>(spec.plugins, "request");
      register_plugins(self->system(), "tokenizer", plugins);  // once for the actors that share it
      return std::make_shared<const tokenize_stage>(std::move(*load_model_tokenizer(spec.tokenizer_path)),
                                                    spec.vocab_size, spec.max_model_len, plugins);
    });
  } catch (const std::exception& e) {
    return refused_placement(self, "tokenizer", e.what());
  }
  return tokenizer_actor(self, std::move(stage), std::move(spec.router), std::move(spec.reply_to));
}

}  // namespace troupe
