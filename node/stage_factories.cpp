#include "node/stage_factories.hpp"

#include <caf/actor_factory.hpp>
#include <caf/spawn_options.hpp>

#include "stages/message_inspect.hpp"
#include "stages/stage_actors.hpp"
#include "stages/tokenize_stage.hpp"

namespace troupe {

namespace {

// The spec overloads of the stage actors, named apart from their in-process siblings.
using tokenizer_fn = caf::behavior (*)(caf::event_based_actor*, tokenizer_spec);
using scheduler_fn = caf::behavior (*)(caf::event_based_actor*, scheduler_spec);
using worker_fn = caf::behavior (*)(caf::event_based_actor*, worker_spec);
using detokenizer_fn = caf::behavior (*)(caf::event_based_actor*, detokenizer_spec);

// Wraps a factory so that `on_spawn` hears of every stage it makes.
caf::actor_factory announced(std::string type, caf::actor_factory make, stage_spawned_fn on_spawn) {
  return [type = std::move(type), make = std::move(make), on_spawn = std::move(on_spawn)](
             caf::actor_config& cfg, caf::message& args) {
    caf::actor_factory_result made = make(cfg, args);
    if (on_spawn && made.first) on_spawn(type, caf::actor_cast<caf::actor>(made.first));
    return made;
  };
}

}  // namespace

void register_stage_types(caf::actor_system_config& config, stage_spawned_fn on_spawn) {
  config.add_actor_factory("tokenizer",
                           announced("tokenizer", caf::make_actor_factory(static_cast<tokenizer_fn>(tokenizer_actor)), on_spawn));
  config.add_actor_factory("scheduler",
                           announced("scheduler", caf::make_actor_factory(static_cast<scheduler_fn>(scheduler_actor)), on_spawn));
  config.add_actor_factory(
      "detokenizer", announced("detokenizer", caf::make_actor_factory(static_cast<detokenizer_fn>(detokenizer_actor)), on_spawn));
  // CAF's factories spawn on the shared scheduler; the worker loads a model and computes, so its
  // factory marks it detached (its own thread), as the colocated node spawns it.
  caf::actor_factory worker = caf::make_actor_factory(static_cast<worker_fn>(worker_actor));
  config.add_actor_factory("worker", announced("worker", [worker](caf::actor_config& cfg, caf::message& args) {
    cfg.flags |= caf::abstract_actor::is_detached_flag;
    return worker(cfg, args);
  }, on_spawn));
}

std::vector<caf::actor> spawn_tokenizers(caf::actor_system& system, const tokenizer_spec& spec, int count) {
  spec.validate();
  auto stage = std::make_shared<const tokenize_stage>(std::move(*load_model_tokenizer(spec.tokenizer_path)),
                                                      spec.vocab_size, spec.max_model_len);
  std::vector<caf::actor> pool;
  for (int i = 0; i < count; ++i) {
    pool.push_back(system.spawn(static_cast<caf::behavior (*)(caf::event_based_actor*, std::shared_ptr<const tokenize_stage>,
                                                               caf::actor, caf::actor)>(tokenizer_actor),
                                stage, spec.scheduler, spec.reply_to));
  }
  return pool;
}

spawned_worker spawn_worker(caf::actor_system& system, const worker_spec& spec) {
  std::shared_ptr<served_model> served = load_served_model(spec.model);
  caf::actor actor = system.spawn<caf::detached>(
      static_cast<caf::behavior (*)(caf::event_based_actor*, std::shared_ptr<served_model>)>(worker_actor), served);
  return {std::move(actor), std::move(served)};
}

caf::actor spawn_scheduler(caf::actor_system& system, const scheduler_spec& spec) {
  spec.validate();
  return system.spawn(static_cast<scheduler_fn>(scheduler_actor), spec);
}

caf::actor spawn_detokenizer(caf::actor_system& system, const detokenizer_spec& spec) {
  spec.validate();
  return system.spawn(static_cast<detokenizer_fn>(detokenizer_actor), spec);
}

}  // namespace troupe
