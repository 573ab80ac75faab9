#include <unordered_map>

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include "net/refusal_log.hpp"
#include "stages/detokenizer_fanout.hpp"
#include "stages/engine_router.hpp"
#include "stages/instance_fan_in.hpp"
#include "stages/message_inspect.hpp"
#include "stages/error_category.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/plugin_route_policy.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

namespace {

struct engine_handles {
  scheduler_handle scheduler;
  worker_handle worker;
  kv_agent_handle kv_agent;
};

const char* state_name(engine_state state) { return state == engine_state::active ? "active" : "draining"; }

// "mixed", "prefill" or "decode": what an instance's step-time model in /metrics was fitted on.
std::string role_name_of(const engine_router& router, engine_instance_id id) {
  for (const engine_instance_info& info : router.instances()) {
    if (info.id == id) return engine_role_name(info.role);
  }
  return engine_role_name(engine_role::mixed);
}

// How long `troupe scale --list` waits for an instance's stages before it lists the instance without.
constexpr auto list_stats_timeout = std::chrono::seconds(2);

}  // namespace

router_handle::behavior_type router_actor(router_handle::pointer self, router_spec spec) {
  keep_exception_in_exit_reason(self);
  auto router = std::make_shared<engine_router>(spec.block_size, spec.failover_wait, spec.pair_admission);
  if (spec.route_plugins && !spec.route_plugins->empty()) {
    router->set_route_policy(std::make_shared<plugin_route_policy>(spec.route_plugins));
    register_plugins(self->system(), "router", spec.route_plugins);
  }
  auto engines = std::make_shared<std::unordered_map<engine_instance_id, engine_handles>>();
  const frontend_handle frontend = spec.reply_to;
  auto detokenizers = std::make_shared<std::vector<detokenizer_handle>>(spec.detokenizers);
  const auto timeout = spec.request_timeout;
  const auto wait_bound = spec.failover_wait.bound;
  auto on_lost = spec.on_engine_lost;
  auto on_tokenized = spec.on_tokenized;
  auto on_tokenizer_lost = spec.on_tokenizer_lost;
  // Which detokenizer gets what, and the resumption of a replaced one (stages/detokenizer_fanout.hpp).
  auto fanout = std::make_shared<detokenizer_fanout>(spec.detokenizers.size(), spec.keep_detokenizer_ledger);

  // The instance whose scheduler (or KV agent) sent the current message.
  auto instance_whose = [=](auto engine_handles::*member) -> std::optional<engine_instance_id> {
    const caf::strong_actor_ptr& sender = self->current_sender();
    if (!sender) return std::nullopt;
    for (const auto& [id, handles] : *engines) {
      const auto& actor = handles.*member;
      if (actor && actor.address() == sender->address()) return id;
    }
    return std::nullopt;
  };
  auto instance_of_sender = [=] { return instance_whose(&engine_handles::scheduler); };
  auto instance_of_kv_agent = [=] { return instance_whose(&engine_handles::kv_agent); };
  auto forward_to_detokenizers = [=](token_batch batch) {
    for (detokenizer_fanout::part& part : fanout->route(std::move(batch), steady_now_ns())) {
      self->send((*detokenizers)[part.detokenizer], std::move(part.batch));
    }
  };
  auto arm_wait_timer = [=] {
    const std::optional<timestamp_ns> due = router->wait_timer_to_set();
    if (!due) return;
    const auto delay = std::chrono::nanoseconds(std::max<timestamp_ns>(0, *due - steady_now_ns()));
    self->delayed_send(self,
                       std::chrono::duration_cast<std::chrono::milliseconds>(delay) + std::chrono::milliseconds(1),
                       failover_wait_atom::value);
  };
  // Refusals at a bounded rate: past capacity they come by the thousand.
  auto refusals = std::make_shared<refusal_log>("router", std::chrono::seconds(10), "request");
  // Sends the request to the instance the router picks (to both halves of a disaggregated
  // pair, the decode half first so its reservation starts at once), or fails it when none
  // takes requests.
  auto dispatch = [=](schedule_request request) {
    const int64_t id = request.request_id;
    const std::optional<engine_router::routed> where = router->route(request);
    if (!where && !router->route_error().empty()) {
      refusals->refuse(router->route_error_code() == error_code::overloaded ? "the decode instances are behind"
                                                                            : "a route policy failed it",
                       router->route_error());
      // Refused (a route plugin failed it, or the decode side is behind): through its
      // detokenizer, which holds text of a re-run one.
      router->drop(id);
      token_batch failed;
      failed.failures.push_back(request_failed{id, router->route_error_code(), router->route_error()});
      forward_to_detokenizers(std::move(failed));
      return;
    }
    if (!where) {
      // None takes requests: the request waits (bounded) for one to join, or fails at once.
      if (router->wait_for_instance(request, steady_now_ns())) {
        arm_wait_timer();
        return;
      }
      self->send(frontend,
                 request_failed{id, error_code::unavailable,
                                router->num_waiting() > 0
                                    ? "no engine instance is available (" + std::to_string(router->num_waiting()) +
                                          " requests already wait for one, the most [cluster] "
                                          "failover_max_waiting allows)"
                                    : std::string("no engine instance is available (every one was "
                                                  "lost or is draining)")});
      return;
    }
    request.kv = {};
    request.attempt = where->attempt;
    if (where->decode) {
      const scheduler_handle& decode = engines->at(*where->decode).scheduler;
      schedule_request receive = request;
      // The prefill instance by its KV agent's address: unique per process incarnation, so a
      // restarted prefill process gets a new communicator on the decode side (kv_transport nccl).
      const kv_agent_handle& prefill_agent = engines->at(where->instance).kv_agent;
      receive.kv = kv_handoff{kv_role::receive, where->transfer_id,
                              prefill_agent ? caf::to_string(prefill_agent.address()) : std::string()};
      self->send(decode, std::move(receive));
      if (where->aborted_early) self->send(decode, abort_request_msg{id});
      request.kv = kv_handoff{kv_role::send, where->transfer_id, {}};
    }
    const scheduler_handle& scheduler = engines->at(where->instance).scheduler;
    self->send(scheduler, std::move(request));
    if (where->aborted_early) self->send(scheduler, abort_request_msg{id});
  };
  // A detokenizer placed in place of a lost one at `index`: the frontend says what each client
  // has, and the new one is sent the rest.
  auto resume_detokenizer = [=](size_t index) {
    const detokenizer_fanout::resume_ticket ticket = fanout->begin_resume(index);
    auto finish = [=](const std::unordered_map<int64_t, int32_t>& delivered) {
      std::optional<detokenizer_ledger::resumption> out = fanout->finish_resume(ticket, delivered);
      if (!out) return;
      const detokenizer_handle& detokenizer = (*detokenizers)[index];
      for (detokenizer_resume_msg& prime : out->primes) self->send(detokenizer, std::move(prime));
      const size_t num_deltas = out->replay.deltas.size();
      if (!out->replay.empty()) self->send(detokenizer, std::move(out->replay));
      spdlog::info("router: detokenizer {} replaced; {} requests resumed there ({} deltas sent again)", index,
                   out->primes.size(), num_deltas);
    };
    const std::vector<int64_t>& asked = ticket.asked;
    self->request(frontend, timeout, delivered_tokens_atom::value, asked)
        .then(
            [=](std::vector<int32_t>& counts) {
              std::unordered_map<int64_t, int32_t> by_id;
              for (size_t i = 0; i < ticket.asked.size() && i < counts.size(); ++i) by_id[ticket.asked[i]] = counts[i];
              finish(by_id);
            },
            [=](caf::error& error) {
              // Cannot happen short of a bug (the frontend is in this process): the requests
              // could only hang, so they end, with the code the frontend's error maps to.
              spdlog::error("router: the frontend did not say what its clients have ({}): failing {} requests",
                            self->system().render(error), ticket.asked.size());
              std::unordered_map<int64_t, int32_t> ended;
              for (int64_t id : ticket.asked) {
                ended[id] = -1;
                self->send(frontend, request_failed{id, wire_code_of(error),
                                                    "its detokenizer was lost and could not be resumed"});
              }
              finish(ended);
            });
  };
  auto carry_out = [=] {
    router_commands commands = router->take_commands();
    for (const auto& [instance, request_id] : commands.aborts) {
      auto it = engines->find(instance);
      if (it != engines->end()) self->send(it->second.scheduler, abort_request_msg{request_id, true});
    }
    for (auto& [instance, handover] : commands.handovers) {
      auto it = engines->find(instance);
      if (it != engines->end()) self->send(it->second.scheduler, std::move(handover));
    }
    for (request_failed& failure : commands.failures) {
      // Through its detokenizer, which may hold text of it and must forget it first.
      token_batch batch;
      batch.failures.push_back(std::move(failure));
      forward_to_detokenizers(std::move(batch));
    }
    if (!commands.ended.empty()) forward_to_detokenizers(std::move(commands.ended));
    for (schedule_request& request : commands.reruns) dispatch(std::move(request));
  };
  // A draining instance whose last request ended is stopped; it is no loss, so no re-run.
  auto stop_if_drained = [=](engine_instance_id id) {
    if (!router->drained(id)) return;
    engine_handles handles = engines->at(id);
    engines->erase(id);
    router->remove_instance(id);
    spdlog::info("router: engine instance {} drained and stopped", id);
    self->send_exit(handles.scheduler, caf::exit_reason::user_shutdown);
    self->send_exit(handles.worker, caf::exit_reason::user_shutdown);
  };

  // Takes instance `id` out now: both halves stopped, its unfinished requests re-run on the
  // others (each stream goes on where it was). `lost`: it failed (the keeper may place it again);
  // else a drain whose time ran out, which is no loss.
  auto take_out = [=](engine_instance_id id, const std::string& why, bool lost) {
    auto it = engines->find(id);
    if (it == engines->end()) return;
    const engine_handles handles = it->second;
    engines->erase(it);
    std::string node;
    engine_state state = engine_state::active;
    engine_role role = engine_role::mixed;
    for (const auto& info : router->instances()) {
      if (info.id != id) continue;
      node = info.node;
      state = info.state;
      role = info.role;
    }
    // The other half of the instance cannot work alone.
    self->send_exit(handles.scheduler, caf::exit_reason::user_shutdown);
    self->send_exit(handles.worker, caf::exit_reason::user_shutdown);
    std::vector<schedule_request> reruns = router->remove_instance(id);
    if (lost) {
      spdlog::warn("router: engine instance {} on {} lost ({}, {}); re-running its {} requests on the {} left", id,
                   node, engine_role_name(role), why, reruns.size(), engines->size());
    } else {
      spdlog::info("router: engine instance {} on {} taken out ({}); re-running its {} requests on the {} left", id,
                   node, why, reruns.size(), engines->size());
    }
    carry_out();  // the other halves of its disaggregated requests are aborted first
    for (schedule_request& request : reruns) dispatch(std::move(request));
    if (router->num_waiting() > 0) {
      spdlog::warn("router: {} requests wait up to {} ms (failover_wait_ms) for an engine instance to come back",
                   router->num_waiting(), wait_bound.count());
    }
    // A draining instance was on its way out: placing it again would undo the drain.
    if (lost && on_lost && state == engine_state::active) on_lost(id, node, role);
  };

  self->set_down_handler([=](caf::down_msg& down) {
    for (const auto& [id, handles] : *engines) {
      if (handles.scheduler.address() != down.source && handles.worker.address() != down.source) continue;
      take_out(id, self->system().render(down.reason), true);
      return;
    }
  });

  return instrumented(
      self, "router",
      {
          [=](engine_joined_atom, scheduler_handle scheduler, worker_handle worker, std::string node,
              kv_agent_handle kv_agent, std::string role_name,
              std::string quantization) -> caf::result<engine_instance_id> {
            engine_role role = engine_role::mixed;
            try {
              role = parse_engine_role(role_name);
            } catch (const std::exception& e) {
              return caf::make_error(error_code::bad_request, std::string(e.what()));
            }
            const size_t num_waited = router->num_waiting();
            const engine_instance_id id = router->add_instance(node, role, std::move(quantization));
            self->monitor(scheduler);
            self->monitor(worker);
            self->send(scheduler, engine_instance_atom::value, id);
            self->send(worker, engine_instance_atom::value, id);
            // Its pool as it starts, so the load it is judged by (and `troupe scale --list`) does not
            // wait for its first token batch.
            self->request(scheduler, timeout, stats_query{0})
                .then(
                    [=](stats_answer& answer) {
                      router->set_load(id, engine_load{answer.num_free_blocks, answer.num_total_blocks,
                                                       answer.num_running, answer.num_waiting});
                    },
                    [](caf::error&) {});  // a lost instance: the down handler deals with it
            engines->emplace(id, engine_handles{std::move(scheduler), std::move(worker), std::move(kv_agent)});
            spdlog::info("router: engine instance {} on {} joined as {} ({} serving)", id, node, role_name,
                         engines->size());
            if (num_waited > 0)
              spdlog::info("router: {} requests that waited for an engine instance run on instance {}", num_waited, id);
            carry_out();  // the requests that waited for an instance (add_instance handed them back)
            return id;
          },
          [=](drain_engine_atom, engine_instance_id id) -> bool {
            if (!router->drain(id)) return false;
            spdlog::info("router: draining engine instance {}", id);
            stop_if_drained(id);
            return true;
          },
          [=](set_detokenizers_atom, std::vector<detokenizer_handle>& replaced) {
            if (replaced.size() != detokenizers->size()) return;
            for (size_t i = 0; i < replaced.size(); ++i) {
              if (replaced[i] == (*detokenizers)[i]) continue;
              (*detokenizers)[i] = replaced[i];
              resume_detokenizer(i);
            }
          },
          [=](drain_node_atom, const std::string& node, int32_t deadline_ms) -> std::vector<int32_t> {
            const std::vector<engine_instance_id> drained = router->drain_node(node);
            spdlog::info("router: draining the {} engine instances on {}{}", drained.size(), node,
                         deadline_ms > 0 ? "; those still busy in " + std::to_string(deadline_ms) +
                                               " ms are taken out and their requests re-run elsewhere"
                                         : std::string());
            for (engine_instance_id id : drained) {
              stop_if_drained(id);
              if (deadline_ms > 0 && engines->count(id)) {
                self->delayed_send(self, std::chrono::milliseconds(deadline_ms), drain_deadline_atom::value, id);
              }
            }
            return std::vector<int32_t>(drained.begin(), drained.end());
          },
          [=](drain_deadline_atom, engine_instance_id id) {
            // Still there: its requests did not all end within the drain's time.
            if (engines->count(id)) take_out(id, "its drain's time ran out", false);
          },
          [=](retokenize_atom) {
            if (on_tokenizer_lost) on_tokenizer_lost();
          },
          [=](abort_all_atom) {
            for (const auto& [request_id, instance] : router->routed_requests()) {
              self->send(engines->at(instance).scheduler, abort_request_msg{request_id});
            }
            for (int64_t request_id : router->waiting_requests()) router->end_waiting(request_id, finish_reason::abort);
            carry_out();
          },
          [=](failover_wait_atom) {
            router->wait_timer_fired();
            const size_t before = router->num_waiting();
            router->expire_waiting(steady_now_ns());
            if (const size_t expired = before - router->num_waiting(); expired > 0) {
              spdlog::warn("router: {} requests failed: no engine instance came back within failover_wait_ms", expired);
            }
            carry_out();
            arm_wait_timer();
          },
          // Disaggregation, from a decode half's scheduler: its reservation (passed on to the prefill
          // half's KV agent), its KV landed, or its transfer failed.
          [=](kv_ready_msg& ready) {
            const std::optional<engine_instance_id> from = instance_of_sender();
            if (!from) return;
            if (auto prefill = router->on_kv_ready(*from, ready))
              self->send(engines->at(*prefill).kv_agent, std::move(ready));
          },
          [=](kv_arrival_msg& arrival) {
            if (const std::optional<engine_instance_id> from = instance_of_sender())
              router->on_kv_landed(*from, arrival);
          },
          [=](kv_failed_msg& failed) {
            if (const std::optional<engine_instance_id> from = instance_of_sender()) {
              spdlog::warn("router: request {} lost its KV transfer on engine instance {}: {}", failed.request_id,
                           *from, failed.why);
              router->on_kv_failed(*from, failed);
              carry_out();
              stop_if_drained(*from);
              return;
            }
            // A prefill half's KV agent: its sender gave the transfer up (logged there).
            if (const std::optional<engine_instance_id> from = instance_of_kv_agent()) {
              router->on_kv_send_failed(*from, failed);
              carry_out();
              stop_if_drained(*from);
            }
          },
          // One line per instance; a pipelined one's stages and their busy shares are asked of its
          // scheduler (the stage board is its process's), so the answer waits for those.
          [=](list_engines_atom) -> caf::result<std::vector<std::string>> {
            struct listing {
              caf::response_promise promise;
              std::vector<std::string> lines;
              size_t num_left = 0;
              void finish_one() {
                if (--num_left == 0) promise.deliver(std::move(lines));
              }
            };
            auto list = std::make_shared<listing>();
            std::vector<scheduler_handle> schedulers;
            for (const engine_instance_info& info : router->instances()) {
              list->lines.push_back(std::to_string(info.id) + " " + info.node + " " + state_name(info.state) +
                                    " requests=" + std::to_string(info.num_requests) +
                                    " queued_prompt_tokens=" + std::to_string(info.num_queued_prompt_tokens) +
                                    " free_blocks=" + std::to_string(info.load.num_free_blocks) + "/" +
                                    std::to_string(info.load.num_total_blocks) +
                                    " role=" + engine_role_name(info.role) +
                                    " quantization=" + (info.quantization.empty() ? "unknown" : info.quantization) +
                                    " awaiting_blocks=" + std::to_string(info.num_awaiting_blocks));
              auto it = engines->find(info.id);
              schedulers.push_back(it == engines->end() ? scheduler_handle{} : it->second.scheduler);
            }
            if (list->lines.empty()) return list->lines;
            list->promise = self->make_response_promise();
            list->num_left = schedulers.size();
            for (size_t i = 0; i < schedulers.size(); ++i) {
              if (!schedulers[i]) {
                list->finish_one();
                continue;
              }
              self->request(schedulers[i], list_stats_timeout, stats_query{0})
                  .then(
                      [=](stats_answer& answer) {
                        if (!answer.pipeline_busy.empty()) list->lines[i] += " stages=" + answer.pipeline_busy;
                        list->finish_one();
                      },
                      [=](caf::error&) { list->finish_one(); });
            }
            return caf::result<std::vector<std::string>>(caf::delegated<std::vector<std::string>>());
          },
          [=](schedule_request& request) {
            if (on_tokenized) on_tokenized(request.request_id);
            // A request tokenized twice (sent again after its tokenizer was lost, though that one had
            // passed it on already): the first one runs.
            if (router->instance_of(request.request_id) || router->is_waiting(request.request_id)) return;
            dispatch(std::move(request));
          },
          [=](token_batch& batch) {
            const std::optional<engine_instance_id> from = instance_of_sender();
            if (!from) return;  // from an instance already lost or stopped: its requests moved on
            token_batch out = router->on_tokens(*from, std::move(batch));
            carry_out();
            forward_to_detokenizers(std::move(out));
            stop_if_drained(*from);
          },
          [=](request_failed& refusal) {
            const std::optional<engine_instance_id> from = instance_of_sender();
            if (!from || !router->on_refusal(*from, refusal)) return;
            carry_out();
            self->send(frontend, std::move(refusal));
            stop_if_drained(*from);
          },
          [=](stop_request_msg& stop) {
            if (auto instance = router->instance_of(stop.request_id)) {
              self->send(engines->at(*instance).scheduler, stop);
            } else if (router->end_waiting(stop.request_id, finish_reason::stop)) {
              carry_out();
            }
          },
          [=](abort_request_msg& abort) {
            if (std::vector<engine_instance_id> holders = router->holders_of(abort.request_id); !holders.empty()) {
              for (engine_instance_id holder : holders) self->send(engines->at(holder).scheduler, abort);
            } else if (router->end_waiting(abort.request_id, finish_reason::abort)) {
              carry_out();
            } else {
              router->abort_unrouted(abort.request_id);
            }
          },
          [=](stats_query& query) {
            if (engines->empty()) {
              self->send(frontend, stats_answer{query.tag, 0, 0, 0, 0, "no engine instance is available"});
              return;
            }
            auto total = std::make_shared<stats_fan_in>(query.tag, static_cast<int>(engines->size()));
            auto settle = [=] {
              if (!total->settled()) return;
              stats_answer answer = total->reply();
              answer.num_overload_refusals = router->num_overload_refusals();
              self->send(frontend, std::move(answer));
            };
            for (const auto& [id, handles] : *engines) {
              self->request(handles.scheduler, timeout, query)
                  .then(
                      [=](stats_answer& answer) {
                        const std::string role = role_name_of(*router, id);
                        for (auto& model : answer.step_models) {
                          model.instance = id;
                          model.role = role;
                        }
                        total->add(answer);
                        settle();
                      },
                      [=](caf::error& error) {
                        total->fail(self->system().render(error));
                        settle();
                      });
            }
          },
          [=](trace_query& query) {
            if (engines->empty()) {
              self->send(frontend, trace_answer{query.tag, {}, {}, "no engine instance is available"});
              return;
            }
            auto total = std::make_shared<trace_fan_in>(query.tag, static_cast<int>(engines->size()));
            auto settle = [=] {
              if (total->settled()) self->send(frontend, total->reply(steady_now_ns()));
            };
            std::unordered_map<engine_instance_id, std::string> nodes;
            for (const auto& info : router->instances()) nodes[info.id] = info.node;
            for (const auto& [id, handles] : *engines) {
              const timestamp_ns sent = steady_now_ns();
              const auto instance = static_cast<int32_t>(id);
              const std::string node = nodes[id];
              self->request(handles.scheduler, timeout, query)
                  .then(
                      [=](trace_answer& answer) {
                        total->add(instance, node, std::move(answer), sent, steady_now_ns());
                        settle();
                      },
                      [=](caf::error& error) {
                        total->fail(self->system().render(error));
                        settle();
                      });
            }
          },
          [](stage_failure_drill& drill) { fail_for_drill(drill.reason); },
      });
}

}  // namespace troupe
