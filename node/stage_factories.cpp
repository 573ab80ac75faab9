#include "node/stage_factories.hpp"

#include <caf/actor_factory.hpp>
#include <caf/spawn_options.hpp>

#include "stages/instrumented_actor.hpp"
#include "stages/message_inspect.hpp"
#include "stages/stage_actors.hpp"
#include "stages/tokenize_stage.hpp"

namespace troupe {

namespace {

// Wraps a factory so that `on_spawn` hears of every stage it makes.
caf::actor_factory announced(std::string type, caf::actor_factory make, stage_spawned_fn on_spawn) {
  return [type = std::move(type), make = std::move(make), on_spawn = std::move(on_spawn)](caf::actor_config& cfg,
                                                                                          caf::message& args) {
    caf::actor_factory_result made = make(cfg, args);
    if (on_spawn && made.first) on_spawn(type, caf::actor_cast<caf::actor>(made.first));
    return made;
  };
}

}  // namespace

void register_stage_types(caf::actor_system_config& config, stage_spawned_fn on_spawn, kv_channel_keys kv_keys) {
  config.add_actor_factory("tokenizer",
                           announced("tokenizer", caf::make_actor_factory(tokenizer_actor_from_spec), on_spawn));
  config.add_actor_factory("scheduler",
                           announced("scheduler", caf::make_actor_factory(scheduler_actor_from_spec), on_spawn));
  config.add_actor_factory("detokenizer",
                           announced("detokenizer", caf::make_actor_factory(detokenizer_actor_from_spec), on_spawn));
  // CAF's factories spawn on the shared scheduler; the worker loads a model and computes, so its
  // factory marks it detached (its own thread), as the colocated node spawns it.
  caf::actor_factory worker = caf::make_actor_factory(worker_actor_from_spec);
  config.add_actor_factory("worker", announced(
                                         "worker",
                                         [worker, kv_keys](caf::actor_config& cfg, caf::message& args) {
                                           cfg.flags |= caf::abstract_actor::is_detached_flag;
                                           if (args.match_elements<worker_spec>())
                                             args.get_mutable_as<worker_spec>(0).kv_keys = kv_keys;
                                           return worker(cfg, args);
                                         },
                                         on_spawn));
}

}  // namespace troupe
