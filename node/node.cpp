#include "node/node.hpp"

#include <csignal>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/make_message.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/atom.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "doors/door_actor.hpp"
#include "doors/http_door.hpp"
#include "doors/reply_router.hpp"
#include "doors/request_admission.hpp"
#include "doors/zmq_door.hpp"
#include "node/admin_door.hpp"
#include "node/cluster_credentials.hpp"
#include "node/engine_placer.hpp"
#include "node/node_link.hpp"
#include "node/openssl_io_hooks.hpp"
#include "node/stage_factories.hpp"
#include "stages/message_inspect.hpp"
#include "stages/message_types.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

namespace {

// Every message type of the stages, registered by name so any node can (de)serialize them.
// A controller that places stages on other nodes (or opens the admin door) also loads the
// middleman with the OpenSSL module: it reaches nodes over mutual TLS with its member
// certificate, heartbeats every connection, and drops one that stays silent.
class node_config : public caf::actor_system_config {
 public:
  node_config(int num_threads, const topology& t) {
    // `sharing` halves small-message round trips against `stealing` on few cores.
    set("scheduler.policy", caf::atom("sharing"));
    set("scheduler.max-threads", static_cast<size_t>(num_threads));
    set("logger.console", caf::atom("none"));
    for_each_message_type([this](auto type, const char* name) {
      add_message_type<typename decltype(type)::type>(name);
    });
    register_stage_types(*this);  // the controller spawns its own stages by name too
    if (t.colocated() && t.cluster.admin_listen.empty()) return;
    const member_credentials files = credentials_in(t.cluster.credentials, t.cluster.name);
    verify_member_credentials(files);
    keep_openssl_error_queue_clean();
    load<caf::io::middleman>();
    load<caf::openssl::manager>();
    set("openssl.certificate", files.certificate.string());
    set("openssl.key", files.private_key.string());
    set("openssl.cafile", files.ca_certificate.string());
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(t.cluster.heartbeat_interval_ms)});
    set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(t.cluster.connection_timeout_ms)});
  }
};

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
    caf::anon_send(tokenizers[next_tokenizer.fetch_add(1) % tokenizers.size()], std::move(request));
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

  std::vector<caf::actor> tokenizers;
  caf::actor router_actor;  // aborts and stats go to the engine instances through it
  std::atomic<size_t> next_tokenizer{0};
  reply_router* router = nullptr;
  std::mutex failure_mutex;
  std::string failure;  // what failed first, once a stage has

  // A stage's watch runs on that stage's thread, possibly while the node is being torn down: it
  // holds watch_mutex while it uses the router and the doors, and does nothing once the node
  // has closed the watch (close_watch), which it does before it stops anything.
  std::mutex watch_mutex;
  bool watch_closed = false;  // guarded by watch_mutex
  void close_watch() {
    std::lock_guard lock(watch_mutex);
    watch_closed = true;
  }
};

// A stage that ends for any reason but the node's own shutdown has failed (an exception in a
// handler ends an actor too, see keep_exception_in_exit_reason). The stages hold each request's
// state between them, so none of the requests inside can finish: they are all failed with the
// reason, and the node refuses new ones rather than let them hang.
void watch_stage(const std::string& stage, const caf::actor& actor, caf::actor_system* system,
                 actor_downstream* downstream, reply_router* router) {
  actor->attach_functor([=](const caf::error& reason) {
    if (!reason || reason == caf::exit_reason::user_shutdown || reason == caf::exit_reason::normal) return;
    std::lock_guard watching(downstream->watch_mutex);
    if (downstream->watch_closed) return;
    const std::string what = "the " + stage + " stage failed: " + system->render(reason);
    {
      std::lock_guard lock(downstream->failure_mutex);
      if (downstream->failure.empty()) downstream->failure = what;
    }
    const size_t num_failed = router->fail_all(error_code::internal, what);
    spdlog::error("{}; failed {} requests in flight, refusing new ones", what, num_failed);
  });
}

}  // namespace

struct node::impl {
  node_config config;
  caf::actor_system system;
  actor_downstream downstream;
  std::unique_ptr<request_admission> admission;
  reply_router router;
  std::unique_ptr<zmq_door> door;
  std::unique_ptr<troupe::http_door> web_door;  // null when [http] is not enabled
  std::unique_ptr<tokenizer> door_tokenizer;    // the HTTP door spells logprob tokens with it
  std::unique_ptr<engine_placer> placer;
  std::vector<caf::actor> actors;
  std::vector<std::pair<std::string, caf::actor>> stages;  // by stage name, for fail_stage
  caf::actor admin;  // null without [cluster] admin_listen

  impl(int num_threads, const topology& t) : config(num_threads, t), system(config) {}
  // A node whose start failed halfway (a door that cannot bind) has stages running; told to
  // stop, they end as at shutdown, where dropped handles would end them `unreachable`, which the
  // stage watch reports as failed stages. node::~node has stopped them already otherwise.
  ~impl() {
    downstream.close_watch();
    if (placer) placer->stop();
    if (admin) caf::anon_send_exit(admin, caf::exit_reason::user_shutdown);
    for (auto& actor : actors) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  }
};

namespace {

// The stages of one kind, spawned on each node the placement names: locally through the same
// factories a node uses, remotely by name over the node link.
std::vector<caf::actor> place_stages(caf::actor_system& system, const topology& t, const std::vector<std::string>& where,
                                     const std::string& type, const caf::message& spec, int count_each) {
  node_link link(system, t.cluster);
  std::vector<caf::actor> placed;
  for (const std::string& node : where) {
    for (int i = 0; i < count_each; ++i) {
      if (node == t.cluster.name) {
        auto stage = system.spawn<caf::actor>(type, spec);
        if (!stage) throw std::runtime_error("cannot spawn a " + type + ": " + system.render(stage.error()));
        placed.push_back(*stage);
      } else {
        placed.push_back(link.spawn(*t.find_node(node), type, spec));
        spdlog::info("{} placed on node {}", type, node);
      }
    }
  }
  return placed;
}

}  // namespace

node::node(const topology& t) : topology_(t) {
  topology_.validate();
  const topology& tp = topology_;
  impl_ = std::make_unique<impl>(std::max(2, tp.tokenizer_pool_size + 1), tp);
  auto& s = *impl_;
  if (!tp.colocated()) spdlog::info("controller '{}': stages placed on {} nodes", tp.cluster.name, tp.nodes.size());

  // The stages start from the same specs a controller sends to another node (node/stage_factories.hpp).
  auto front = s.system.spawn(door_actor, &s.router);
  s.actors.push_back(front);
  std::vector<caf::actor> detokenizers =
      place_stages(s.system, tp, tp.placement.detokenizers, "detokenizer",
                   caf::make_message(detokenizer_spec{tp.model.path, front}), 1);
  s.actors.insert(s.actors.end(), detokenizers.begin(), detokenizers.end());

  // The engines: every instance the placement names, through the router. Instances that come
  // later (a node back, `troupe scale`) join the same router.
  s.placer = std::make_unique<engine_placer>(s.system, tp);
  engine_placer* placer = s.placer.get();
  router_spec routing;
  routing.detokenizers = detokenizers;
  routing.reply_to = front;
  routing.request_timeout = std::chrono::milliseconds(tp.cluster.request_timeout_ms);
  routing.on_engine_lost = [placer](engine_instance_id, const std::string& node) { placer->place_again_later(node); };
  std::vector<placed_engine> engines;
  // The router needs the block size, which the first worker tells.
  engines.push_back([&] {
    routing.block_size = tp.model.block_size;
    auto router = s.system.spawn(router_actor, routing);
    s.downstream.router_actor = router;
    s.actors.push_back(router);
    placer->set_router(router);
    return placer->place(tp.placement.engines.front());
  }());
  for (size_t i = 1; i < tp.placement.engines.size(); ++i) engines.push_back(placer->place(tp.placement.engines[i]));
  const worker_description& model = engines.front().description;
  if (const auto& local = engines.front().local_model; local && !local->device_note.empty()) {
    spdlog::log(tp.model.device == device_request::cuda ? spdlog::level::warn : spdlog::level::info, "{}",
                local->device_note);
  }
  spdlog::info("{}", model.summary);
  const int max_model_len = model.config.max_model_len;

  // One bound on requests in flight for both doors: what the schedulers can run and queue.
  s.admission = std::make_unique<request_admission>(
      (int64_t(tp.max_waiting_requests) + tp.model.max_num_seqs) * int64_t(tp.placement.engines.size()));
  spdlog::info("controller instance {} (the high bits of its request ids)", s.admission->controller_id());
  zmq_door_options options;
  options.endpoint = tp.zmq_endpoint;
  options.api_key = tp.api_key;
  options.limits.max_frame_bytes = tp.max_frame_bytes;
  options.limits.max_model_len = max_model_len;
  options.max_prompt_tokens = max_model_len;
  options.listen_backlog = tp.listen_backlog;
  s.door = std::make_unique<zmq_door>(options, s.downstream, *s.admission);
  s.router.set_door(client_door::zmq, s.door.get());
  if (tp.http_enabled) {
    http_options web;
    web.host = tp.http_host;
    web.port = tp.http_port;
    web.api_key = tp.api_key;
    web.max_body_bytes = tp.http_max_body_bytes;
    web.max_connections = tp.http_max_connections;
    web.request_timeout_ms = tp.http_request_timeout_ms;
    web.max_header_bytes = tp.http_max_header_bytes;
    web.model_name = tp.served_model_name.empty() ? tp.model.path : tp.served_model_name;
    web.limits.max_model_len = max_model_len;
    s.door_tokenizer = load_model_tokenizer(tp.model.path);
    const tokenizer* tok = s.door_tokenizer.get();
    s.web_door = std::make_unique<http_door>(web, s.downstream, *s.admission, s.router.counters(),
                                                  [tok](int32_t id) { return tok->decode(std::span(&id, 1)); });
    s.router.set_door(client_door::http, s.web_door.get());
  }

  const tokenizer_spec tokenizing{tp.model.path, model.config.vocab_size, max_model_len, s.downstream.router_actor, front};
  if (tp.placement.tokenizers.size() == 1 && tp.placement.tokenizers.front() == tp.cluster.name) {
    s.downstream.tokenizers = spawn_tokenizers(s.system, tokenizing, tp.tokenizer_pool_size);  // one tokenizer, shared
  } else {
    s.downstream.tokenizers = place_stages(s.system, tp, tp.placement.tokenizers, "tokenizer",
                                           caf::make_message(tokenizing), tp.tokenizer_pool_size);
  }
  s.downstream.router = &s.router;
  s.actors.insert(s.actors.end(), s.downstream.tokenizers.begin(), s.downstream.tokenizers.end());
  for (const placed_engine& engine : engines) s.actors.insert(s.actors.end(), {engine.scheduler, engine.worker});
  // A stage that fails ends the node's service; an engine instance on another node is the
  // router's to replace (failover), so only the controller's own engines are watched here.
  s.stages = {{"frontend", front}, {"router", s.downstream.router_actor}};
  for (const caf::actor& detokenizer : detokenizers) s.stages.emplace_back("detokenizer", detokenizer);
  for (const placed_engine& engine : engines) {
    if (engine.node != tp.cluster.name) continue;
    s.stages.emplace_back("worker", engine.worker);
    s.stages.emplace_back("scheduler", engine.scheduler);
  }
  for (const caf::actor& tokenizer : s.downstream.tokenizers) s.stages.emplace_back("tokenizer", tokenizer);
  for (const auto& [name, actor] : s.stages) watch_stage(name, actor, &s.system, &s.downstream, &s.router);
  if (!tp.cluster.admin_listen.empty()) s.admin = open_admin_door(s.system, tp, placer, s.downstream.router_actor);
  s.door->start();
  if (s.web_door) {
    s.web_door->start();
    spdlog::info("OpenAI-compatible HTTP API on http://{}:{}/v1 (model '{}')", tp.http_host, s.web_door->port(),
                 tp.served_model_name.empty() ? tp.model.path : tp.served_model_name);
  }
  spdlog::info("serving on {} (scheduler: {} batched tokens, {} seqs, {} waiting, async scheduling {}; {} tokenizers, "
               "{} engine instances)",
               tp.zmq_endpoint, tp.max_num_batched_tokens, tp.model.max_num_seqs, tp.max_waiting_requests,
               tp.async_scheduling ? "on" : "off", s.downstream.tokenizers.size(), engines.size());
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
  impl_->placer->stop();
  if (impl_->admin) caf::anon_send_exit(impl_->admin, caf::exit_reason::user_shutdown);
  for (auto& actor : impl_->actors) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  impl_->system.await_all_actors_done();
}

bool node::out_of_service() const { return impl_->router.refusing(); }

std::string node::zmq_endpoint() const { return impl_->door->bound_endpoint(); }

void serve_until_signal(const topology& t) {
  // Block the signals before any thread starts, so every thread inherits the mask and only
  // sigwait below sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  node n(t);
  int received = 0;
  sigwait(&signals, &received);
  spdlog::info("signal {}: shutting down", received);
}

}  // namespace troupe
