#include <caf/after.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "engine/draft_model_proposer.hpp"
#include "engine/guided_vocabulary.hpp"
#include "engine/model_runner.hpp"
#include "engine/ngram_proposer.hpp"
#include "engine/process_cpu.hpp"
#include "engine/served_model.hpp"
#include "kvtransfer/kv_connector.hpp"
#include "model/stage_lost_error.hpp"
#include "stages/message_inspect.hpp"
#include "stages/plugin_logits_hook.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/stage_actors.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

namespace {

// The worker's proposer, named in one log line: which one it is decides its speed, never its output.
std::unique_ptr<draft_proposer> make_draft_proposer(const served_model& target, worker_drafts drafts) {
  const int vocab = target.backend_model->config().vocab_size;
  if (drafts.draft_model) {
    auto proposer = std::make_unique<draft_model_proposer>(std::move(drafts.draft_model), vocab);
    spdlog::info("worker: speculative decoding drafts from {}", proposer->describe());
    return proposer;
  }
  spdlog::info("worker: speculative decoding drafts by n-gram prompt lookup, n={}..{}", drafts.ngram.min_n,
               drafts.ngram.max_n);
  return std::make_unique<ngram_proposer>(drafts.ngram);
}

}  // namespace

worker_drafts load_worker_drafts(const worker_spec& spec, const served_model& target) {
  worker_drafts drafts;
  drafts.ngram = spec.ngram;
  if (spec.draft_model.path.empty()) return drafts;
  drafts.draft_model = load_draft_model(spec.draft_model, target.backend_model->config().vocab_size);
  if (!drafts.draft_model->device_note.empty()) spdlog::info("draft model: {}", drafts.draft_model->device_note);
  return drafts;
}

std::shared_ptr<plugin_chain> load_worker_logits_plugins(const worker_spec& spec) {
  if (spec.plugins.empty()) return nullptr;
  auto chain = std::make_shared<plugin_chain>(spec.plugins, "logits");
  if (chain->empty()) return nullptr;
  for (const plugin_counters& c : chain->counters()) spdlog::info("worker: logits plugin '{}' loaded", c.plugin);
  return chain;
}

worker_handle::behavior_type worker_actor(worker_handle::pointer self, std::shared_ptr<served_model> served,
                                          worker_kv_settings kv, worker_drafts drafts,
                                          std::shared_ptr<plugin_chain> logits_plugins) {
  keep_exception_in_exit_reason(self);
  auto runner = std::make_shared<model_runner>(*served->backend_model);
  runner->set_draft_proposer(make_draft_proposer(*served, std::move(drafts)));
  if (logits_plugins) {
    register_plugins(self->system(), "worker", logits_plugins);
    runner->set_logits_hook(std::make_unique<plugin_logits_hook>(logits_plugins));
  }
  // The receiver reports on its own thread; the agent's mailbox brings it back to actor land. A
  // weak handle: the agent owns the receiver, which must not keep the agent alive.
  auto agent_slot = std::make_shared<caf::weak_actor_ptr>();
  auto report = [agent_slot](kv_arrival_msg arrival) {
    if (auto agent = agent_slot->lock()) caf::anon_send(caf::actor_cast<kv_agent_handle>(agent), std::move(arrival));
  };
  // So does the sender, for a transfer it gave up: the agent tells the router.
  auto report_send_failure = [agent_slot](uint64_t transfer_id, const std::string& why) {
    if (auto agent = agent_slot->lock()) {
      caf::anon_send(caf::actor_cast<kv_agent_handle>(agent), kv_failed_msg{0, transfer_id, why});
    }
  };
  kv_connector_settings kv_settings;
  kv_settings.channel.bind_host = kv.bind_host;
  kv_settings.channel.keys = kv.keys;
  kv_settings.transfer_timeout = kv.transfer_timeout;
  kv_settings.transport = kv.transport;
  kv_settings.stage_pairs = kv.stage_pairs;
  // Aliasing the served model: the connector keeps it (and so the pool its receiver imports
  // into) alive.
  auto connector = std::make_shared<kv_connector>(
      std::shared_ptr<model>(served, served->backend_model.get()), kv_settings,
      kv_receiver_events{[report](uint64_t transfer_id, int64_t request_id) {
                           report(kv_arrival_msg{request_id, transfer_id, true, {}});
                         },
                         [report](uint64_t transfer_id, int64_t request_id, const std::string& why) {
                           report(kv_arrival_msg{request_id, transfer_id, false, why});
                         }},
      kv_sender_events{report_send_failure});
  runner->stream_kv_to(connector->make_layer_sink());
  kv_agent_handle agent = self->spawn<caf::linked>(kv_agent_actor, connector);
  *agent_slot = caf::actor_cast<caf::weak_actor_ptr>(agent);

  // Structured output masks tokens by their bytes; a model without EOS ids cannot end a
  // constrained output, so it serves none (the runner refuses such requests by name).
  if (served->tok && !served->eos_token_ids.empty()) {
    const int32_t vocab = served->backend_model->config().vocab_size;
    runner->set_vocabulary(make_token_vocabulary(*served->tok, vocab, served->eos_token_ids),
                           make_token_vocabulary(*served->tok, vocab, served->eos_token_ids, /*spell_special=*/true));
  }
  return instrumented(self, "worker",
                      {
                          [served, runner](step_plan& plan) -> step_done {
                            step_done done;
                            const timestamp_ns begin = steady_now_ns();
                            const int64_t cpu_begin = thread_cpu_ns();
                            try {
                              done.result = runner->run(plan);
                            } catch (const stage_lost_error& e) {
                              done.error = e.what();
                              done.stage_lost = true;
                              done.result.step_id = plan.step_id;
                            } catch (const std::exception& e) {
                              done.error = e.what();
                              done.result.step_id = plan.step_id;
                            }
                            done.compute_ns = steady_now_ns() - begin;
                            add_step_cpu_ns(thread_cpu_ns() - cpu_begin);
                            return done;
                          },
                          [served, agent](describe_atom) {
                            return worker_description{served->base_engine_config(), served->eos_token_ids,
                                                      describe(*served), served->loaded.quantization, agent};
                          },
                          [self](engine_instance_atom, int32_t instance) { name_engine_instance(self, instance); },
                          [](stage_failure_drill& drill) { fail_for_drill(drill.reason); },
                      });
}

void attach_pipeline_stages(const worker_spec& spec, const kv_channel_keys& keys, served_model& served) {
  if (spec.pipeline.empty()) return;
  served.backend_model = make_pipelined_model(std::move(served.backend_model), spec.pipeline, keys);
}

worker_handle::behavior_type worker_actor_from_spec(worker_handle::pointer self, worker_spec spec) {
  keep_exception_in_exit_reason(self);
  std::shared_ptr<served_model> served;
  worker_kv_settings kv;
  worker_drafts drafts;
  std::shared_ptr<plugin_chain> logits_plugins;
  try {
    logits_plugins = load_worker_logits_plugins(spec);
    served = load_served_model(spec.model);
    attach_pipeline_stages(spec, spec.kv_keys, *served);
    kv.bind_host = spec.kv_bind_host;
    kv.transfer_timeout = std::chrono::milliseconds(spec.kv_transfer_timeout_ms);
    kv.keys = std::move(spec.kv_keys);
    kv.transport = spec.kv_transport;
    kv.stage_pairs = spec.pipeline.kv_stage_pairs;
    check_kv_transport(kv.transport, *served->backend_model);
    drafts = load_worker_drafts(spec, *served);
    mark_serving_began();  // a node's CPU counters (scheduler answers) leave the loading out
  } catch (const std::exception& e) {
    return refused_placement(self, "worker", e.what());
  }
  if (!served->device_note.empty()) {
    spdlog::log(spec.model.device == device_request::cuda ? spdlog::level::warn : spdlog::level::info, "{}",
                served->device_note);
  }
  spdlog::info("worker: {}", describe(*served));
  return worker_actor(self, std::move(served), std::move(kv), std::move(drafts), std::move(logits_plugins));
}

}  // namespace troupe
