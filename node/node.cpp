#include "node/node.hpp"

#include <csignal>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "doors/door_actor.hpp"
#include "doors/http_door.hpp"
#include "doors/reply_router.hpp"
#include "doors/request_admission.hpp"
#include "doors/zmq_door.hpp"
#include "node/stage_factories.hpp"
#include "stages/message_inspect.hpp"
#include "stages/message_types.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

namespace {

// Every message type of the stages, registered by name so any node can (de)serialize them.
class node_config : public caf::actor_system_config {
 public:
  explicit node_config(int num_threads) {
    // `sharing` halves small-message round trips against `stealing` on few cores.
    set("scheduler.policy", caf::atom("sharing"));
    set("scheduler.max-threads", static_cast<size_t>(num_threads));
    set("logger.console", caf::atom("none"));
    for_each_message_type([this](auto type, const char* name) {
      add_message_type<typename decltype(type)::type>(name);
    });
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
  void abort(int64_t request_id) override { caf::anon_send(scheduler, abort_request_msg{request_id}); }
  void query_stats(uint64_t tag) override {
    // The scheduler may be the stage that failed: say so rather than leave the asker waiting.
    if (router->refusing()) {
      router->route(stats_answer{tag, 0, 0, 0, 0, out_of_service_message()});
      return;
    }
    caf::anon_send(scheduler, stats_query{tag});
  }

  std::vector<caf::actor> tokenizers;
  caf::actor scheduler;
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
  std::shared_ptr<const served_model> served;  // the worker's model, for the doors' limits
  node_config config;
  caf::actor_system system;
  actor_downstream downstream;
  std::unique_ptr<request_admission> admission;
  reply_router router;
  std::unique_ptr<zmq_door> door;
  std::unique_ptr<troupe::http_door> web_door;  // null when [http] is not enabled
  std::vector<caf::actor> actors;
  std::vector<std::pair<std::string, caf::actor>> stages;  // by stage name, for fail_stage

  explicit impl(int num_threads) : config(num_threads), system(config) {}
  // A node whose start failed halfway (a door that cannot bind) has stages running; told to
  // stop, they end as at shutdown, where dropped handles would end them `unreachable`, which the
  // stage watch reports as failed stages. node::~node has stopped them already otherwise.
  ~impl() {
    downstream.close_watch();
    for (auto& actor : actors) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  }
};

node::node(const topology& t) {
  t.validate();
  impl_ = std::make_unique<impl>(std::max(2, t.tokenizer_pool_size + 1));
  auto& s = *impl_;
  // The worker's spec loads the model, once: the node reads its limits from the same copy.
  spawned_worker worker = spawn_worker(s.system, worker_spec{t.model});
  s.served = worker.served;
  s.actors.push_back(worker.actor);
  const served_model* served = s.served.get();
  if (!served->device_note.empty()) {
    spdlog::log(t.model.device == device_request::cuda ? spdlog::level::warn : spdlog::level::info, "{}", served->device_note);
  }
  spdlog::info("{}", describe(*served));

  // One bound on requests in flight for both doors: what the scheduler can run and queue.
  s.admission = std::make_unique<request_admission>(int64_t(t.max_waiting_requests) + t.model.max_num_seqs);
  spdlog::info("controller instance {} (the high bits of its request ids)", s.admission->controller_id());
  zmq_door_options options;
  options.endpoint = t.zmq_endpoint;
  options.api_key = t.api_key;
  options.limits.max_frame_bytes = t.max_frame_bytes;
  options.limits.max_model_len = served->max_model_len;
  options.max_prompt_tokens = served->max_model_len;
  options.listen_backlog = t.listen_backlog;
  s.door = std::make_unique<zmq_door>(options, s.downstream, *s.admission);
  s.router.set_door(client_door::zmq, s.door.get());
  if (t.http_enabled) {
    http_options web;
    web.host = t.http_host;
    web.port = t.http_port;
    web.api_key = t.api_key;
    web.max_body_bytes = t.http_max_body_bytes;
    web.max_connections = t.http_max_connections;
    web.request_timeout_ms = t.http_request_timeout_ms;
    web.max_header_bytes = t.http_max_header_bytes;
    web.model_name = t.served_model_name.empty() ? t.model.path : t.served_model_name;
    web.limits.max_model_len = served->max_model_len;
    const tokenizer* tok = served->tok.get();
    s.web_door = std::make_unique<http_door>(web, s.downstream, *s.admission, s.router.counters(),
                                                  [tok](int32_t id) { return tok->decode(std::span(&id, 1)); });
    s.router.set_door(client_door::http, s.web_door.get());
  }

  engine_config config = served->base_engine_config();
  config.max_num_batched_tokens = t.max_num_batched_tokens;
  config.max_num_seqs = t.model.max_num_seqs;
  config.max_waiting_requests = t.max_waiting_requests;
  config.async_scheduling = t.async_scheduling;
  config.validate();
  const std::vector<int32_t>& eos = served->eos_token_ids;

  // The stages start from the same specs a controller sends to another node (node/stage_factories.hpp).
  auto front = s.system.spawn(door_actor, &s.router);
  auto detokenizer = spawn_detokenizer(s.system, detokenizer_spec{t.model.path, front});
  auto scheduler = spawn_scheduler(s.system, scheduler_spec{config, eos, worker.actor, detokenizer, front});
  s.actors = {front, detokenizer, worker.actor, scheduler};
  s.downstream.tokenizers = spawn_tokenizers(
      s.system, tokenizer_spec{t.model.path, served->loaded.config.vocab_size, served->max_model_len, scheduler, front},
      t.tokenizer_pool_size);
  s.downstream.scheduler = scheduler;
  s.downstream.router = &s.router;
  s.actors.insert(s.actors.end(), s.downstream.tokenizers.begin(), s.downstream.tokenizers.end());
  s.stages = {{"frontend", front}, {"detokenizer", detokenizer}, {"worker", worker.actor}, {"scheduler", scheduler}};
  for (const caf::actor& tokenizer : s.downstream.tokenizers) s.stages.emplace_back("tokenizer", tokenizer);
  for (const auto& [name, actor] : s.stages) watch_stage(name, actor, &s.system, &s.downstream, &s.router);
  s.door->start();
  if (s.web_door) {
    s.web_door->start();
    spdlog::info("OpenAI-compatible HTTP API on http://{}:{}/v1 (model '{}')", t.http_host, s.web_door->port(),
                 t.served_model_name.empty() ? t.model.path : t.served_model_name);
  }
  spdlog::info("serving on {} (scheduler: {} batched tokens, {} seqs, {} waiting, async scheduling {}; {} tokenizers)",
               t.zmq_endpoint, t.max_num_batched_tokens, t.model.max_num_seqs, t.max_waiting_requests,
               config.async_scheduling ? "on" : "off", t.tokenizer_pool_size);
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
