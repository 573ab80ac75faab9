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

std::vector<tokenizer_handle> spawn_tokenizers(caf::actor_system& system, const tokenizer_spec& spec, int count) {
  spec.validate();
  auto plugins = std::make_shared<plugin_chain>(spec.plugins, "request");
  register_plugins(system, "tokenizer", plugins);
  auto stage = std::make_shared<const tokenize_stage>(std::move(*load_model_tokenizer(spec.tokenizer_path)),
                                                      spec.vocab_size, spec.max_model_len, plugins);
  std::vector<tokenizer_handle> pool;
  for (int i = 0; i < count; ++i) {
    pool.push_back(system.spawn(tokenizer_actor, stage, spec.router, spec.reply_to));
  }
  return pool;
}

spawned_worker spawn_worker(caf::actor_system& system, const worker_spec& spec, const kv_channel_keys& kv_keys) {
  std::shared_ptr<plugin_chain> logits_plugins = load_worker_logits_plugins(spec);
  std::shared_ptr<served_model> served = load_served_model(spec.model);
  attach_pipeline_stages(spec, kv_keys, *served);
  worker_kv_settings kv;
  kv.bind_host = spec.kv_bind_host;
  kv.transfer_timeout = std::chrono::milliseconds(spec.kv_transfer_timeout_ms);
  kv.keys = kv_keys;
  kv.transport = spec.kv_transport;
  check_kv_transport(kv.transport, *served->backend_model);  // fails the spawn, as a bad draft does
  worker_drafts drafts = load_worker_drafts(spec, *served);
  worker_handle actor =
      system.spawn<caf::detached>(worker_actor, served, kv, std::move(drafts), std::move(logits_plugins));
  return {std::move(actor), std::move(served)};
}

scheduler_handle spawn_scheduler(caf::actor_system& system, const scheduler_spec& spec) {
  spec.validate();
  return system.spawn(scheduler_actor_from_spec, spec);
}

}  // namespace troupe
