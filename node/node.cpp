#include "node/node.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <thread>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <stdexcept>
#include <string>
#include <utility>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/make_message.hpp>
#include <caf/atom.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "doors/door_actor.hpp"
#include "doors/http/embedding_pooling.hpp"
#include "doors/http_door.hpp"
#include "doors/reply_router.hpp"
#include "doors/request_admission.hpp"
#include "doors/throughput_log.hpp"
#include "doors/operator_log.hpp"
#include "doors/zmq_door.hpp"
#include "node/actor_metrics_text.hpp"
#include "node/admin_door.hpp"
#include "node/cluster_credentials.hpp"
#include "node/topology_files.hpp"
#include "node/drain_plan.hpp"
#include "node/engine_placer.hpp"
#include "node/inspection.hpp"
#include "node/node_inspector.hpp"
#include "engine/process_cpu.hpp"
#include "node/node_link.hpp"
#include "node/stage_owner.hpp"
#include "node/stage_factories.hpp"
#include "node/tls_middleman.hpp"
#include "stages/error_category.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/message_inspect.hpp"
#include "stages/message_types.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

namespace {

// Every message type of the stages, registered by name so any node can (de)serialize them.
// A controller that places stages on other nodes (or opens the admin door) also loads the
// middleman: it reaches nodes over mutual TLS with its member certificate (node/tls_middleman.hpp),
// heartbeats every connection, and drops one that stays silent.
bool needs_cluster(const topology& t) { return !t.colocated() || !t.cluster.admin_listen.empty(); }

class node_config : public caf::actor_system_config, public actor_stats_host {
 public:
  node_config(int num_threads, const topology& t) {
    // `sharing` halves small-message round trips against `stealing` on few cores.
    set("scheduler.policy", caf::atom("sharing"));
    set("scheduler.max-threads", static_cast<size_t>(num_threads));
    set("logger.console", caf::atom("none"));
    for_each_message_type(
        [this](auto type, const char* name) { add_message_type<typename decltype(type)::type>(name); });
    register_error_category(*this);
    // The controller spawns its own stages by name too; its workers carry KV with its keys.
    register_stage_types(*this, {},
                         t.cluster.credentials.empty() ? kv_channel_keys{}
                                                       : load_kv_channel_keys(t.cluster.credentials, t.cluster.name));
    if (!needs_cluster(t)) return;
    verify_member_credentials(credentials_in(t.cluster.credentials, t.cluster.name));
    load<caf::io::middleman>();
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(t.cluster.heartbeat_interval_ms)});
    set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(t.cluster.connection_timeout_ms)});
  }
};

// A stage and the node it runs on (the controller's own name for this process); `Handle` is its
// interface (stages/stage_interfaces.hpp), or caf::actor where only its life is watched.
template <class Handle>
struct placed_stage {
  std::string node;
  Handle actor;
};
using placed_tokenizer = placed_stage<tokenizer_handle>;
using placed_detokenizer = placed_stage<detokenizer_handle>;

// The doors' way into the actor system: anonymous sends from the ZeroMQ thread and from the
// HTTP connection threads.
class actor_downstream : public door_downstream {
 public:
  void submit(tokenize_request request) override {
    // Refused once a stage has failed: the request could only hang.
    if (!router->track(request.request_id)) {
      router->route(request_failed{request.request_id, error_code::internal, out_of_service_message()});
      return;
    }
    tokenizer_handle tokenizer;
    {
      std::lock_guard lock(tokenizers_mutex);
      if (!tokenizers.empty()) tokenizer = tokenizers[next_tokenizer_index++ % tokenizers.size()].actor;
      if (keep_tokenizations) keep_tokenization(tokenizer, request);
    }
    // No tokenizer only while a lost one is being replaced: the request waits in the kept ones.
    if (tokenizer) caf::anon_send(tokenizer, std::move(request));
  }
  void set_tokenizers(std::vector<placed_tokenizer> pool) {
    std::lock_guard lock(tokenizers_mutex);
    tokenizers = std::move(pool);
  }

  // Tokenizer failover. A request sent to a tokenizer on another node is kept (guarded by
  // tokenizers_mutex) until the router has it; a tokenizer lost with its node takes the requests
  // in its mailbox along, and these are sent again to the tokenizers left (resend_lost_tokenizations).
  struct kept_tokenization {
    tokenizer_handle tokenizer;  // where it went (null: nowhere yet)
    tokenize_request request;
  };
  bool keep_tokenizations = false;  // set once, before serving: a tokenizer runs on another node
  std::unordered_map<int64_t, kept_tokenization> kept_tokenizations;
  size_t forget_ended_tokenizations_at = 4096;
  void keep_tokenization(const tokenizer_handle& tokenizer, const tokenize_request& request) {
    kept_tokenizations[request.request_id] = {tokenizer, request};
    if (kept_tokenizations.size() <= forget_ended_tokenizations_at) return;
    // Requests a tokenizer refused (the client has its error) never reach the router.
    std::erase_if(kept_tokenizations, [this](const auto& kept) { return !router->tracks(kept.first); });
    forget_ended_tokenizations_at = std::max<size_t>(4096, 2 * kept_tokenizations.size());
  }
  void tokenized(int64_t request_id) {
    std::lock_guard lock(tokenizers_mutex);
    kept_tokenizations.erase(request_id);
  }
  // A tokenizer is gone: no request goes to it from now on.
  void drop_tokenizer(const caf::actor_addr& lost) {
    std::lock_guard lock(tokenizers_mutex);
    std::erase_if(tokenizers, [&](const placed_tokenizer& stage) { return stage.actor.address() == lost; });
  }
  // On the router's thread, after every request a lost tokenizer passed on was routed: the rest
  // of what went to tokenizers no longer in the pool is tokenized again.
  void resend_lost_tokenizations() {
    std::vector<std::pair<tokenizer_handle, tokenize_request>> again;
    size_t num_unplaced = 0;
    {
      std::lock_guard lock(tokenizers_mutex);
      for (auto it = kept_tokenizations.begin(); it != kept_tokenizations.end();) {
        const bool in_pool = std::any_of(tokenizers.begin(), tokenizers.end(), [&](const placed_tokenizer& stage) {
          return stage.actor == it->second.tokenizer;
        });
        if (!router->tracks(it->first)) {
          it = kept_tokenizations.erase(it);
          continue;
        }
        if (!in_pool || !it->second.tokenizer) {
          if (tokenizers.empty()) {
            ++num_unplaced;
          } else {
            it->second.tokenizer = tokenizers[next_tokenizer_index++ % tokenizers.size()].actor;
            again.emplace_back(it->second.tokenizer, it->second.request);
          }
        }
        ++it;
      }
    }
    for (auto& [tokenizer, request] : again) caf::anon_send(tokenizer, std::move(request));
    spdlog::info("tokenized again {} requests their lost tokenizer had not passed on{}", again.size(),
                 num_unplaced ? fmt::format(" ({} wait for a tokenizer)", num_unplaced) : std::string());
  }
  std::string out_of_service_message() {
    std::lock_guard lock(failure_mutex);
    return "the node is out of service: " + failure;
  }
  void abort(int64_t request_id) override { caf::anon_send(router_actor, abort_request_msg{request_id}); }
  void query_stats(uint64_t tag) override {
    // The scheduler may be the stage that failed: say so rather than leave the asker waiting.
    if (router->refusing()) {
      router->route(stats_answer{tag, 0, 0, 0, 0, out_of_service_message()});
      return;
    }
    caf::anon_send(router_actor, stats_query{tag});
  }
  void query_trace(uint64_t tag, duration_ns window) override {
    if (router->refusing()) {
      router->route(trace_answer{tag, {}, {}, out_of_service_message()});
      return;
    }
    caf::anon_send(router_actor, trace_query{tag, window});
  }

  std::mutex tokenizers_mutex;
  std::vector<placed_tokenizer> tokenizers;  // guarded: replaced when a lost tokenizer node is back
  size_t next_tokenizer_index = 0;           // guarded by tokenizers_mutex
  router_handle router_actor;                // aborts and stats go to the engine instances through it
  reply_router* router = nullptr;
  std::mutex failure_mutex;
  std::string failure;  // what failed first, once a stage has

  // A stage's watch runs on that stage's thread, possibly while the node is being torn down: it
  // holds the gate's mutex while it uses the router and the doors, and does nothing once the
  // node has closed the gate (close_watch), which it does before it stops anything. The gate is
  // shared with every watch: a remote stage's proxy may end after the node is gone.
  struct watch_gate {
    std::mutex mutex;
    bool closed = false;  // guarded by mutex
  };
  std::shared_ptr<watch_gate> gate = std::make_shared<watch_gate>();
  std::mutex& watch_mutex = gate->mutex;
  // Guarded by watch_mutex: a stage of this process failed (no way back but a restart), and the
  // stages of other nodes that failed and wait to be placed again, as (kind, node).
  bool failed_for_good = false;
  std::set<std::pair<std::string, std::string>> lost_remote;
  void close_watch() {
    std::lock_guard lock(gate->mutex);
    gate->closed = true;
  }
};

}  // namespace

struct node::impl {
  node_config config;
  caf::actor_system system;
  // The cluster's TLS plane (null when colocated without an admin door): destroyed just before
  // the system, after everything that connects through it.
  std::unique_ptr<tls_middleman> tls;
  actor_downstream downstream;
  std::unique_ptr<request_admission> admission;
  reply_router router;
  std::unique_ptr<zmq_door> door;
  std::unique_ptr<troupe::http_door> web_door;  // null when [http] is not enabled
  std::unique_ptr<tokenizer> door_tokenizer;    // the HTTP door spells logprob tokens with it
  std::unique_ptr<engine_placer> placer;
  std::vector<caf::actor> actors;                          // guarded by downstream.watch_mutex once serving
  std::vector<std::pair<std::string, caf::actor>> stages;  // by stage name, for fail_stage
  caf::actor admin;                                        // null without [cluster] admin_listen
  caf::actor inspector;  // the cluster inspector: troupe inspect (through admin) and /metrics
  caf::actor presence;   // what nodes watch to stop this controller's stages (node/stage_owner.hpp)
  const topology* t = nullptr;
  // What a lost tokenizer pool or detokenizer is placed again from.
  std::optional<tokenizer_spec> tokenizing;
  std::optional<detokenizer_spec> detokenizing;
  std::vector<placed_detokenizer> detokenizers;  // in the router's order; guarded by downstream.watch_mutex
  throughput_log throughput;                     // fed by the operator stats answers, on the frontend actor's thread

  impl(int num_threads, const topology& tp) : config(num_threads, tp), system(config), t(&tp) {
    if (needs_cluster(tp)) {
      tls = std::make_unique<tls_middleman>(system, credentials_in(tp.cluster.credentials, tp.cluster.name),
                                            tp.cluster.tls);
      presence = system.spawn(controller_presence);
    }
  }

  void watch(const std::string& stage, const std::string& node, const caf::actor& actor);
  void restore(const std::string& kind, const std::string& node);
  // A node whose start failed halfway (a door that cannot bind) has stages running; told to
  // stop, they end as at shutdown, where dropped handles would end them `unreachable`, which the
  // stage watch reports as failed stages. node::~node has stopped them already otherwise.
  ~impl() {
    downstream.close_watch();
    if (placer) placer->stop();
    if (admin) caf::anon_send_exit(admin, caf::exit_reason::user_shutdown);
    if (presence) caf::anon_send_exit(presence, caf::exit_reason::user_shutdown);
    for (auto& actor : actors) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  }
};

namespace {

// The stages of one kind, spawned on each node the placement names from their spec, through the
// same factories here and there (node_link::spawn_on), as a `Handle`.
template <class Handle>
std::vector<placed_stage<Handle>> place_stages(caf::actor_system& system, const topology& t,
                                               const std::vector<std::string>& where, const std::string& type,
                                               const caf::message& spec, int count_each, const caf::actor& owner) {
  node_link link(system, t.cluster, owner);
  std::vector<placed_stage<Handle>> placed;
  for (const std::string& node : where) {
    for (int i = 0; i < count_each; ++i) {
      const bool here = node == t.cluster.name;
      const node_address* address = here ? nullptr : t.find_node(node);
      if (!here && !address) throw std::runtime_error("no node named '" + node + "' in the topology's [[nodes]]");
      placed.push_back({node, link.spawn_on<Handle>(address, type, spec)});
      if (!here) spdlog::info("{} placed on node {}", type, node);
      // One that could not load its tokenizer there answers with the reason (a refused
      // placement) rather than ending unheard: the operator learns the node, stage and why now.
      if (type == "tokenizer" || type == "detokenizer") {
        (void)link.ask<bool>(placed.back().actor, "the " + type + " on node " + node, loaded_atom::value);
      }
    }
  }
  return placed;
}

template <class Handle>
std::vector<Handle> actors_of(const std::vector<placed_stage<Handle>>& stages) {
  std::vector<Handle> out;
  for (const placed_stage<Handle>& stage : stages) out.push_back(stage.actor);
  return out;
}

}  // namespace

// A stage that ends for any reason but the node's own shutdown has failed (an exception in a
// handler ends an actor too, see keep_exception_in_exit_reason; so does a lost node). The stages
// hold each request's state between them, so none of the requests inside can finish: they are
// all failed with the reason, the engines told to drop them, and the node refuses new ones rather
// than let them hang. A stage of this process is a bug: the node stays out of service. A stage on
// another node is placed again when that node answers, and then the node serves again.
void node::impl::watch(const std::string& stage, const std::string& node, const caf::actor& actor) {
  actor->attach_functor([this, gate = downstream.gate, stage, node,
                         address = actor.address()](const caf::error& reason) {
    if (!reason || reason == caf::exit_reason::user_shutdown || reason == caf::exit_reason::normal) return;
    std::lock_guard watching(gate->mutex);
    if (gate->closed) return;  // the node is going or gone: `this` may be too
    const bool remote = node != t->cluster.name;
    if (remote && (stage == "tokenizer" || stage == "detokenizer")) {
      // Failover: the stage is placed again on the controller at once (restore), and its
      // requests go on: a tokenizer's are tokenized again, a detokenizer's resumed by its
      // replacement from what the router sent it (stages/detokenizer_ledger.hpp).
      if (stage == "tokenizer") downstream.drop_tokenizer(address);
      if (downstream.lost_remote.emplace(stage, node).second) placer->place_again_later(node, stage);
      spdlog::warn("the {} stage on node {} was lost ({}): placing it on {} now; its requests go on", stage, node,
                   system.render(reason), t->cluster.name);
      return;
    }
    const std::string what =
        "the " + stage + " stage" + (remote ? " on node " + node : std::string()) + " failed: " + system.render(reason);
    {
      std::lock_guard lock(downstream.failure_mutex);
      if (downstream.failure.empty()) downstream.failure = what;
    }
    const size_t num_failed = router.fail_all(error_code::internal, what);
    caf::anon_send(downstream.router_actor, abort_all_atom::value);
    if (!remote) {
      downstream.failed_for_good = true;
    } else if (downstream.lost_remote.emplace(stage, node).second) {
      placer->place_again_later(node, stage);
    }
    spdlog::error("{}; failed {} requests in flight, refusing new ones{}", what, num_failed,
                  remote ? " until the node is back" : "");
  });
}

// Called by the placer's keeper: places the lost tokenizer pool or detokenizer on `node` again
// (throws while the node does not answer), hands it to whoever sends to it, and serves again
// once nothing lost is left.
void node::impl::restore(const std::string& kind, const std::string& node) {
  // Where the lost stages go: the controller, which is never the one lost (its loss ends the
  // service) and has the tokenizer files (it checked them at start).
  const std::string& here = t->cluster.name;
  if (kind == "tokenizer") {
    std::vector<placed_tokenizer> fresh = place_stages<tokenizer_handle>(
        system, *t, {here}, "tokenizer", caf::make_message(*tokenizing), t->tokenizer_pool_size, presence);
    std::vector<placed_tokenizer> pool;
    {
      std::lock_guard lock(downstream.tokenizers_mutex);
      for (const placed_tokenizer& stage : downstream.tokenizers) {
        if (stage.node != node) pool.push_back(stage);
      }
    }
    pool.insert(pool.end(), fresh.begin(), fresh.end());
    downstream.set_tokenizers(std::move(pool));
    for (const placed_tokenizer& stage : fresh) watch("tokenizer", here, caf::actor_cast<caf::actor>(stage.actor));
    // Behind every request the lost ones passed on, in the router's mailbox.
    caf::anon_send(downstream.router_actor, retokenize_atom::value);
    spdlog::info("the tokenizer stage of node {} now runs on {}", node, here);
    std::lock_guard watching(downstream.watch_mutex);
    for (const placed_tokenizer& stage : fresh) actors.push_back(caf::actor_cast<caf::actor>(stage.actor));
  } else if (kind == "detokenizer") {
    std::vector<placed_detokenizer> fresh = place_stages<detokenizer_handle>(
        system, *t, {here}, "detokenizer", caf::make_message(*detokenizing), 1, presence);
    watch("detokenizer", here, caf::actor_cast<caf::actor>(fresh.front().actor));
    spdlog::info("the detokenizer stage of node {} now runs on {}", node, here);
    std::lock_guard watching(downstream.watch_mutex);
    // Each lost one of this node is replaced by the new one, keeping the router's order.
    for (placed_detokenizer& stage : detokenizers) {
      if (stage.node == node) stage = fresh.front();
    }
    caf::anon_send(downstream.router_actor, set_detokenizers_atom::value, actors_of(detokenizers));
    actors.push_back(caf::actor_cast<caf::actor>(fresh.front().actor));
  }
  std::lock_guard watching(downstream.watch_mutex);
  downstream.lost_remote.erase({kind, node});
  if (downstream.lost_remote.empty() && !downstream.failed_for_good && router.refusing()) {
    {
      std::lock_guard lock(downstream.failure_mutex);
      downstream.failure.clear();
    }
    router.serve_again();
    spdlog::info("serving again: the {} stage of node {} is placed again", kind, node);
  }
}

node::node(const topology& t) : topology_(t) {
  topology_.validate();
  const topology& tp = topology_;
  // Its own stages' files, before any stage or door starts (launch checked its nodes' too).
  check_topology_files(tp, {tp.cluster.name}, "topology");
  impl_ = std::make_unique<impl>(std::max(2, tp.tokenizer_pool_size + 1), tp);
  auto& s = *impl_;
  s.t = &topology_;
  if (!tp.colocated()) spdlog::info("controller '{}': stages placed on {} nodes", tp.cluster.name, tp.nodes.size());

  // The stages start from the same specs a controller sends to another node (node/stage_factories.hpp).
  s.router.set_access_log(tp.access_log);
  s.router.set_operator_stats_listener([&s](const stats_answer& answer) {
    const serving_counters& c = s.router.counters();
    throughput_sample sample;
    sample.at = steady_now_ns();
    sample.num_prompt_tokens = c.num_prompt_tokens;
    sample.num_generation_tokens = c.num_output_tokens_routed;
    sample.num_finished = c.num_finished_stop + c.num_finished_length + c.num_finished_abort + c.num_failed;
    sample.has_engine_gauges = answer.unavailable.empty();
    sample.num_running = answer.num_running;
    sample.num_waiting = answer.num_waiting;
    sample.num_free_blocks = answer.num_free_blocks;
    sample.num_total_blocks = answer.num_total_blocks;
    if (auto line = s.throughput.next(sample)) {
      emit_structured("throughput", throughput_log_text(*line), throughput_log_fields(*line));
    }
  });
  auto front = s.system.spawn(door_actor, &s.router);
  s.actors.push_back(caf::actor_cast<caf::actor>(front));
  s.detokenizing = detokenizer_spec{tp.model.path, front, tp.plugins};
  s.detokenizers = place_stages<detokenizer_handle>(s.system, tp, tp.placement.detokenizers, "detokenizer",
                                                    caf::make_message(*s.detokenizing), 1, s.presence);
  const std::vector<detokenizer_handle> detokenizers = actors_of(s.detokenizers);
  for (const detokenizer_handle& d : detokenizers) s.actors.push_back(caf::actor_cast<caf::actor>(d));

  // The engines: every instance the placement names, through the router. Instances that come
  // later (a node back, `troupe scale`) join the same router.
  s.placer = std::make_unique<engine_placer>(s.system, tp, s.presence);
  engine_placer* placer = s.placer.get();
  placer->set_stage_restorer([&s](const std::string& kind, const std::string& node) { s.restore(kind, node); });
  router_spec routing;
  routing.detokenizers = detokenizers;
  routing.reply_to = front;
  routing.request_timeout = std::chrono::milliseconds(tp.cluster.request_timeout_ms);
  routing.on_engine_lost = [placer](engine_instance_id, const std::string& node, engine_role role) {
    placer->place_again_later(node, role == engine_role::mixed ? "engine" : engine_role_name(role));
  };
  // Stages on other nodes may be lost mid-request: what they were sent is kept for their
  // replacements (tokenizer and detokenizer failover, impl::watch).
  auto elsewhere = [&tp](const std::vector<std::string>& nodes) {
    return std::any_of(nodes.begin(), nodes.end(), [&tp](const std::string& n) { return n != tp.cluster.name; });
  };
  routing.keep_detokenizer_ledger = elsewhere(tp.placement.detokenizers);
  if (elsewhere(tp.placement.tokenizers)) {
    s.downstream.keep_tokenizations = true;
    routing.on_tokenized = [&s](int64_t request_id) { s.downstream.tokenized(request_id); };
    routing.on_tokenizer_lost = [&s] { s.downstream.resend_lost_tokenizations(); };
  }
  // Mixed instances, then the prefill and the decode halves of a disaggregated topology.
  std::vector<std::pair<std::string, engine_role>> instances;
  for (const std::string& node : tp.placement.engines) instances.emplace_back(node, engine_role::mixed);
  for (const std::string& node : tp.placement.prefill) instances.emplace_back(node, engine_role::prefill);
  for (const std::string& node : tp.placement.decode) instances.emplace_back(node, engine_role::decode);
  routing.block_size = tp.model.block_size;
  // Route plugins run in the router, here on the controller (one instance for all requests).
  routing.route_plugins = std::make_shared<plugin_chain>(tp.plugins, "route");
  // Waiting for an instance to come back makes sense only where one can: an engine on another
  // node (launch restarts it, the keeper places it again) or one `troupe scale --add` can add.
  const bool instance_can_come_back =
      !tp.cluster.admin_listen.empty() ||
      std::any_of(instances.begin(), instances.end(), [&tp](const auto& i) { return i.first != tp.cluster.name; });
  if (instance_can_come_back) {
    routing.failover_wait.bound = std::chrono::milliseconds(tp.cluster.failover_wait_ms);
    routing.failover_wait.max_waiting = static_cast<size_t>(tp.cluster.failover_max_waiting);
  }
  routing.pair_admission.reservation_wait_bound =
      std::chrono::milliseconds(tp.disaggregation.reservation_wait_bound_ms());
  auto router = s.system.spawn(router_actor, routing);
  s.downstream.router_actor = router;
  s.actors.push_back(caf::actor_cast<caf::actor>(router));
  placer->set_router(router);
  std::vector<placed_engine> engines;
  for (const auto& [node, role] : instances) engines.push_back(placer->place(node, role));
  const worker_description& model = engines.front().description;
  spdlog::info("{}", model.summary);
  const int max_model_len = model.config.max_model_len;

  // One bound on requests in flight for both doors: what the schedulers can run and queue.
  s.admission = std::make_unique<request_admission>((int64_t(tp.max_waiting_requests) + tp.model.max_num_seqs) *
                                                    int64_t(instances.size()));
  spdlog::info("controller instance {} (the high bits of its request ids)", s.admission->controller_id());
  zmq_door_options options;
  options.endpoint = tp.zmq_endpoint;
  options.api_key = tp.api_key;
  const auto tenants = tp.tenants.empty() ? nullptr : std::make_shared<const tenant_table>(tp.tenants);
  options.tenants = tenants;
  options.limits.max_frame_bytes = tp.max_frame_bytes;
  options.limits.max_model_len = max_model_len;
  options.max_prompt_tokens = max_model_len;
  options.listen_backlog = tp.listen_backlog;
  options.handshake_timeout_ms = tp.zmq_handshake_timeout_ms;
  options.max_pending_handshakes = tp.zmq_max_pending_handshakes;
  options.max_connections = tp.zmq_max_connections;
  options.access_log = tp.access_log;
  s.door = std::make_unique<zmq_door>(options, s.downstream, *s.admission);
  s.router.set_door(client_door::zmq, s.door.get());
  s.inspector = spawn_cluster_inspector(s.system, tp);
  s.actors.push_back(s.inspector);
  if (tp.http_enabled) {
    http_options web;
    // Every actor's mailbox and handler figures as Prometheus gauges, from the cluster inspector
    // (bounded: a node that does not answer in time is reported down, not waited for).
    web.extra_metrics = [system = &s.system, inspector = s.inspector]() -> std::string {
      caf::scoped_actor asker(*system);
      std::string text;
      asker->request(inspector, std::chrono::seconds(3), inspect_atom::value)
          .receive(
              [&](std::string& json) {
                text = actor_metrics_text(cluster_inspection_from_json(nlohmann::json::parse(json)));
              },
              [&](caf::error&) {});
      return text;
    };
    web.host = tp.http_host;
    web.port = tp.http_port;
    web.api_key = tp.api_key;
    web.access_log = tp.access_log;
    web.tenants = tenants;
    web.max_body_bytes = tp.http_max_body_bytes;
    web.max_connections = tp.http_max_connections;
    web.request_timeout_ms = tp.http_request_timeout_ms;
    web.max_waiting_connections = tp.http_max_waiting_connections;
    web.max_header_bytes = tp.http_max_header_bytes;
    web.allowed_origins = tp.http_allowed_origins;
    web.model_name = tp.model_name();
    web.limits.max_model_len = max_model_len;
    web.quantization = model.quantization;
    s.door_tokenizer = load_model_tokenizer(tp.model.path);
    const tokenizer* tok = s.door_tokenizer.get();
    web.text_tokenizer = std::make_shared<const tokenizer>(*tok);
    web.chat = std::make_shared<const chat_prompt>(*tok);
    web.answer_format = detect_chat_format(web.chat->template_source());
    if (model.config.hidden_size > 0) {
      const pooling_settings pooling = read_pooling_settings(tp.model.path);
      web.embedding_pooling = pooling.pooling;
      web.embedding_normalize = pooling.normalize;
      web.embedding_size = model.config.hidden_size;
      spdlog::info("embeddings: {} pooling{}, {} dimensions (from {})",
                   pooling.pooling == pooling_kind::mean ? "mean" : "last-token",
                   pooling.normalize ? ", normalized" : "", web.embedding_size, pooling.source);
    }
    if (tp.tool_call_parser != "auto") web.answer_format.tools = *parse_tool_call_syntax(tp.tool_call_parser);
    if (tp.reasoning_parser != "auto") web.answer_format.reasoning = *parse_reasoning_syntax(tp.reasoning_parser);
    spdlog::info("chat answers: tool calls {}, reasoning {}{}", tool_call_syntax_name(web.answer_format.tools),
                 reasoning_syntax_name(web.answer_format.reasoning),
                 tp.tool_call_parser == "auto" && tp.reasoning_parser == "auto" ? " (from the chat template)" : "");
    // Logprobs show each token's bytes, which add up to the text (a continuation's detokenization).
    web.token_is_special = [tok](int32_t id) { return tok->is_special(id); };
    s.web_door = std::make_unique<http_door>(web, s.downstream, *s.admission, s.router.counters(),
                                             [tok](int32_t id) { return tok->token_bytes(id); });
    s.router.set_door(client_door::http, s.web_door.get());
  }

  s.tokenizing = tokenizer_spec{tp.model.path, model.config.vocab_size, max_model_len, s.downstream.router_actor, front,
                                tp.plugins};
  // A pool placed on one node shares one loaded tokenizer there (stages/shared_tokenize_stages.hpp).
  std::vector<placed_tokenizer> tokenizers =
      place_stages<tokenizer_handle>(s.system, tp, tp.placement.tokenizers, "tokenizer",
                                     caf::make_message(*s.tokenizing), tp.tokenizer_pool_size, s.presence);
  s.downstream.set_tokenizers(tokenizers);
  s.downstream.router = &s.router;
  for (const placed_tokenizer& tokenizer : tokenizers) s.actors.push_back(caf::actor_cast<caf::actor>(tokenizer.actor));
  for (const placed_engine& engine : engines) {
    s.actors.insert(s.actors.end(),
                    {caf::actor_cast<caf::actor>(engine.scheduler), caf::actor_cast<caf::actor>(engine.worker)});
  }
  // A stage that fails ends the node's service (until a lost node is back, impl::watch); an
  // engine instance on another node is the router's to replace (failover), so only the
  // controller's own engines are watched here.
  const std::string& here = tp.cluster.name;
  std::vector<std::pair<std::string, placed_stage<caf::actor>>> watched = {
      {"frontend", {here, caf::actor_cast<caf::actor>(front)}},
      {"router", {here, caf::actor_cast<caf::actor>(s.downstream.router_actor)}}};
  for (const placed_detokenizer& detokenizer : s.detokenizers) {
    watched.push_back({"detokenizer", {detokenizer.node, caf::actor_cast<caf::actor>(detokenizer.actor)}});
  }
  for (const placed_engine& engine : engines) {
    if (engine.node != here) continue;
    watched.push_back({"worker", {here, caf::actor_cast<caf::actor>(engine.worker)}});
    watched.push_back({"scheduler", {here, caf::actor_cast<caf::actor>(engine.scheduler)}});
  }
  for (const placed_tokenizer& tokenizer : tokenizers) {
    watched.push_back({"tokenizer", {tokenizer.node, caf::actor_cast<caf::actor>(tokenizer.actor)}});
  }
  for (const auto& [name, stage] : watched) {
    s.stages.emplace_back(name, stage.actor);
    s.watch(name, stage.node, stage.actor);
  }
  if (!tp.cluster.admin_listen.empty()) {
    // An added instance can run and queue as many requests as each of the topology's.
    request_admission* admission = s.admission.get();
    const int64_t per_instance = int64_t(tp.max_waiting_requests) + tp.model.max_num_seqs;
    s.admin = open_admin_door(
        s.system, tp, placer, s.downstream.router_actor, [admission, per_instance] { admission->grow(per_instance); },
        s.inspector);
  }
  s.door->start();
  if (s.web_door) s.web_door->start();
  mark_serving_began();  // /metrics' CPU counters leave the loading out
  // Both addresses on one line: what a user looks for first.
  const std::string http = s.web_door ? fmt::format(", OpenAI-compatible HTTP API on http://{}:{}/v1 (model '{}')",
                                                    tp.http_host, s.web_door->port(), tp.model_name())
                                      : std::string(", HTTP API off");
  spdlog::info("serving: ZeroMQ on {}{}", s.door->bound_endpoint(), http);
  spdlog::info(
      "scheduler: {} batched tokens, {} seqs, {} waiting, async scheduling {}; {} tokenizers, {} engine instances",
      tp.max_num_batched_tokens, tp.model.max_num_seqs, tp.max_waiting_requests, tp.async_scheduling ? "on" : "off",
      tokenizers.size(), engines.size());
  const speculative_settings& spec = tp.speculative;
  spdlog::info("speculative decoding: {} drafts per step for requests that do not choose, up to {}, from {}",
               spec.num_draft_tokens, spec.max_draft_tokens,
               spec.draft_model.empty()
                   ? fmt::format("n-gram prompt lookup n={}..{}", spec.ngram.min_n, spec.ngram.max_n)
                   : "draft model " + spec.draft_model);
}

void node::fail_stage(const std::string& stage, const std::string& reason) {
  for (const auto& [name, actor] : impl_->stages) {
    if (name == stage && name != "frontend") {  // the frontend only routes replies: no drill
      caf::anon_send(actor, stage_failure_drill{reason});
      return;
    }
  }
  throw std::invalid_argument("node::fail_stage: no stage named '" + stage +
                              "' (tokenizer, scheduler, worker or detokenizer)");
}

node::~node() {
  if (!impl_) return;
  impl_->downstream.close_watch();  // waits for a watch that is failing requests right now
  if (impl_->web_door) impl_->web_door->stop();
  impl_->door->stop();
  impl_->placer->stop();  // after it, nothing adds to the actors
  if (impl_->admin) caf::anon_send_exit(impl_->admin, caf::exit_reason::user_shutdown);
  if (impl_->presence) caf::anon_send_exit(impl_->presence, caf::exit_reason::user_shutdown);
  for (auto& actor : impl_->actors) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  impl_->system.await_all_actors_done();
}

bool node::out_of_service() const { return impl_->router.refusing(); }

std::string node::zmq_endpoint() const { return impl_->door->bound_endpoint(); }

void node::close_admission(const std::string& reason) { impl_->admission->close(reason); }

size_t node::num_running() const {
  const int64_t admitted = impl_->admission->num_in_flight();
  const int generating = impl_->web_door ? impl_->web_door->num_generating() : 0;
  return static_cast<size_t>(std::max<int64_t>(admitted, 0) + std::max(generating, 0));
}

void node::end_running(const std::string& reason) {
  auto& s = *impl_;
  const size_t num_ended = s.router.fail_all(error_code::unavailable, reason);
  caf::anon_send(s.downstream.router_actor, abort_all_atom::value);  // the engines drop their work
  spdlog::warn("{}: ended {} requests with an error", reason, num_ended);
}

void node::log_throughput() { impl_->downstream.query_stats(reply_router::operator_stats_tag); }

namespace {

// Waits up to `timeout` for SIGINT or SIGTERM (blocked in every thread); the signal, or 0.
int wait_for_signal(const sigset_t& signals, std::chrono::milliseconds timeout) {
  timespec wait{};
  wait.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  wait.tv_nsec = static_cast<long>(timeout.count() % 1000) * 1000000L;
  const int received = sigtimedwait(&signals, nullptr, &wait);
  return received > 0 ? received : 0;
}

}  // namespace

void serve_until_signal(const topology& t) {
  // Block the signals before any thread starts, so every thread inherits the mask and only
  // the waits below see them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  node n(t);
  using clock = std::chrono::steady_clock;
  constexpr auto tick = std::chrono::milliseconds(100);
  const auto stats_interval = std::chrono::seconds(t.log_stats_interval_s);
  auto next_stats = clock::now() + stats_interval;
  if (t.log_stats_interval_s > 0) n.log_throughput();  // the first interval's baseline: serving starts now
  // Logs the throughput line when it is due (never with an interval of 0).
  auto stats_when_due = [&] {
    if (t.log_stats_interval_s <= 0 || clock::now() < next_stats) return;
    n.log_throughput();
    next_stats += stats_interval;
    if (next_stats < clock::now()) next_stats = clock::now() + stats_interval;  // a long stall: no burst
  };
  int received = 0;
  while ((received = wait_for_signal(signals, tick)) == 0) stats_when_due();

  // The drain: admission closed now; the doors are stopped (by ~node) only once every request
  // has been answered, its stream to `[DONE]`, or ended with an error that its client got.
  constexpr auto flush_limit = std::chrono::seconds(5);
  drain_plan plan(std::chrono::seconds(t.drain_timeout_s), flush_limit);
  plan.begin(clock::now());
  n.close_admission(plan.refusal());
  spdlog::info("signal {}: draining {} requests (up to {} s; a second signal ends them now), refusing new ones",
               received, n.num_running(), t.drain_timeout_s);
  for (;;) {
    const bool interrupted = wait_for_signal(signals, tick) != 0;
    const drain_plan::action next = plan.next(clock::now(), n.num_running(), interrupted);
    if (next == drain_plan::action::stop) break;
    if (next == drain_plan::action::end_the_rest) n.end_running(plan.end_reason());
    stats_when_due();
  }
  // The last replies are in the doors' sockets; the ZeroMQ door's relay and libzmq's I/O thread
  // carry them out within milliseconds, before stop() closes the connections.
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  spdlog::info("drained ({} requests left): shutting down", n.num_running());
}

}  // namespace troupe
