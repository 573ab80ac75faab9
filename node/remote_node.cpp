#include "node/remote_node.hpp"

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <algorithm>
#include <charconv>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/make_message.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "node/cluster_credentials.hpp"
#include "node/node_inspector.hpp"
#include "node/topology.hpp"
#include "node/stage_factories.hpp"
#include "node/stage_owner.hpp"
#include "node/tls_middleman.hpp"
#include "stages/error_category.hpp"
#include "stages/instrumented_actor.hpp"
#include "stages/message_inspect.hpp"
#include "stages/message_types.hpp"

namespace troupe {

void parse_listen_address(const std::string& text, remote_node_options& options) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw std::invalid_argument("--listen '" + text + "': expected HOST:PORT, e.g. 127.0.0.1:4500");
  }
  const std::string port_text = text.substr(colon + 1);
  unsigned port = 0;
  const auto [end, problem] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || problem != std::errc() || end != port_text.data() + port_text.size() || port > 65535) {
    throw std::invalid_argument("--listen '" + text + "': the port must be a number from 0 to 65535");
  }
  options.host = text.substr(0, colon);
  options.port = static_cast<uint16_t>(port);
}

namespace {

// The stages running here, as controllers spawned them; read by the agent's ping.
class stage_registry {
 public:
  void add(const std::string& type, const caf::actor& stage) {
    std::lock_guard lock(mutex_);
    stages_.emplace_back(type, stage);
    ids_.push_back(stage.id());
  }
  // Every stage ever spawned here, ended or not.
  std::vector<caf::actor_id> all_ids() const {
    std::lock_guard lock(mutex_);
    return ids_;
  }
  void remove(const caf::actor_addr& stage) {
    std::lock_guard lock(mutex_);
    std::erase_if(stages_, [&](const auto& entry) { return entry.second.address() == stage; });
  }
  std::vector<std::string> types() const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (const auto& entry : stages_) out.push_back(entry.first);
    return out;
  }
  std::vector<caf::actor> actors() const {
    std::lock_guard lock(mutex_);
    std::vector<caf::actor> out;
    for (const auto& entry : stages_) out.push_back(entry.second);
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<std::string, caf::actor>> stages_;
  std::vector<caf::actor_id> ids_;
};

class remote_node_config : public caf::actor_system_config, public actor_stats_host {
 public:
  remote_node_config(const kv_channel_keys& kv_keys, stage_registry* registry) {
    load<caf::io::middleman>();
    // As the colocated node: `sharing` is faster for small messages on few cores.
    set("scheduler.policy", caf::atom("sharing"));
    set("scheduler.max-threads", static_cast<size_t>(std::max(2u, std::thread::hardware_concurrency())));
    set("logger.console", caf::atom("none"));
    // The controller drops a connection that stays silent for its connection_timeout_ms: the
    // node keeps it alive with heartbeats (topology.hpp: node_heartbeat_interval_ms).
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(node_heartbeat_interval_ms)});
    for_each_message_type(
        [this](auto type, const char* name) { add_message_type<typename decltype(type)::type>(name); });
    register_error_category(*this);
    register_stage_types(
        *this,
        [registry](const std::string& type, const caf::actor& stage) {
          spdlog::info("stage {} spawned by a controller", type);
          registry->add(type, stage);
          // The stage's end, whatever its reason (a failed load ends it with the file's name).
          stage->attach_functor([registry, type, addr = stage.address()](const caf::error& reason) {
            registry->remove(addr);
            if (!reason || reason == caf::exit_reason::user_shutdown || reason == caf::exit_reason::normal) {
              spdlog::info("stage {} stopped", type);
            } else {
              spdlog::error("stage {} ended: {}", type, caf::to_string(reason));
            }
          });
        },
        kv_keys);
  }
};

// Answers pings with the node's name and its stages, and logs the first message of each peer:
// CAF 0.17 tells no one of a connection (or a refused handshake) until a message arrives. Stops
// the stages a controller placed here once that controller is gone (node/stage_owner.hpp).
caf::behavior node_agent(caf::event_based_actor* self, std::string name, const stage_registry* registry,
                         caf::actor inspector) {
  auto peers = std::make_shared<std::set<std::string>>();
  // Per controller (its presence actor), the stages it placed here.
  auto owned = std::make_shared<std::map<caf::actor_addr, std::vector<caf::actor>>>();
  self->link_to(inspector);  // they go together
  self->set_down_handler([=](caf::down_msg& down) {
    auto it = owned->find(down.source);
    if (it == owned->end()) return;
    std::vector<caf::actor> stages = std::move(it->second);
    owned->erase(it);
    const std::vector<caf::actor> running = registry->actors();
    size_t num_running = 0;
    for (const caf::actor& stage : stages) {
      if (std::find(running.begin(), running.end(), stage) != running.end()) ++num_running;
    }
    spdlog::warn("node {}: the controller that placed {} running stages here is gone ({}); stopping them", name,
                 num_running, self->system().render(down.reason));
    for (const caf::actor& stage : stages) {
      self->send_exit(stage, caf::exit_reason::user_shutdown);
      // Held for the vanished peer's proxies, which it will never release (see ~impl below).
      self->system().registry().erase(stage.id());
    }
  });
  return instrumented(self, "agent",
                      {
                          [=](ping_atom) -> caf::message {
                            if (const auto& sender = self->current_sender()) {
                              const std::string peer = to_string(sender->node());
                              if (peers->insert(peer).second) spdlog::info("node {}: peer {} connected", name, peer);
                            }
                            return caf::make_message(name, registry->types());
                          },
                          [=](stage_owner_atom, caf::actor stage, caf::actor owner) {
                            if (!stage || !owner) return;
                            auto [it, first] = owned->try_emplace(owner.address());
                            if (first) self->monitor(owner);
                            it->second.push_back(std::move(stage));
                            // Stages that ended on their own need not be stopped later.
                            const std::vector<caf::actor> running = registry->actors();
                            std::erase_if(it->second, [&](const caf::actor& s) {
                              return std::find(running.begin(), running.end(), s) == running.end();
                            });
                          },
                          [=](inspect_atom inspect) { return self->delegate(inspector, inspect); },  // `troupe inspect`
                      });
}

}  // namespace

struct remote_node::impl {
  stage_registry registry;  // outlives the system: the stages' exit functors write to it
  remote_node_config config;
  caf::actor_system system;
  tls_middleman tls;  // destroyed just before the system
  caf::actor agent;
  uint16_t port = 0;

  impl(const member_credentials& files, const kv_channel_keys& kv_keys, const tls_limits& limits)
      : config(kv_keys, &registry), system(config), tls(system, files, limits) {}
  ~impl() {
    if (agent) caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
    for (const caf::actor& stage : registry.actors()) caf::anon_send_exit(stage, caf::exit_reason::user_shutdown);
    // CAF 0.17 keeps every actor whose handle went to a peer in its actor registry until that
    // peer says it dropped its proxy, which a controller that vanished never does. The worker is
    // detached, and the actor system's destructor waits for its thread, which waits for the last
    // reference: the node hung on SIGTERM after its controller had gone. The stages are ours to
    // end, so their registry entries go too.
    for (caf::actor_id id : registry.all_ids()) system.registry().erase(id);
  }
};

remote_node::remote_node(const remote_node_options& options) {
  if (options.credentials_dir.empty()) {
    throw std::runtime_error("--credentials is required: nodes authenticate with mutual TLS (troupe certs)");
  }
  if (options.name.empty()) throw std::runtime_error("--name is required: the member whose certificate the node uses");
  if (options.host.empty()) throw std::runtime_error("--listen needs a host, e.g. 127.0.0.1:4500");
  const member_credentials files = credentials_in(options.credentials_dir, options.name);
  verify_member_credentials(files);
  // The KV data plane authenticates with the member's CURVE keys (troupe certs writes them).
  impl_ = std::make_unique<impl>(files, load_kv_channel_keys(options.credentials_dir, options.name), options.tls);
  auto inspector = impl_->system.spawn(node_inspector_actor, options.name, std::chrono::milliseconds(500));
  impl_->agent = impl_->system.spawn(node_agent, options.name, &impl_->registry, std::move(inspector));
  auto bound = tls_publish(impl_->system, impl_->agent, options.port, options.host);
  if (!bound) {
    throw std::runtime_error("node " + options.name + ": cannot listen on " + options.host + ":" +
                             std::to_string(options.port) + ": " + impl_->system.render(bound.error()));
  }
  impl_->port = *bound;
}

remote_node::~remote_node() = default;

uint16_t remote_node::port() const { return impl_->port; }

std::vector<std::string> remote_node::running_stages() const { return impl_->registry.types(); }

void run_node_until_signal(const remote_node_options& options) {
  // Blocked before any thread starts, so that only sigwait below sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto n = std::make_unique<remote_node>(options);
  spdlog::info("node {} listening on {}:{}", options.name, options.host, n->port());
  int received = 0;
  sigwait(&signals, &received);
  spdlog::info("signal {}: node {} shutting down", received, options.name);
  // The stages are told to stop, then the actor system waits for every detached thread. CAF 0.17
  // can keep a stage's actor referenced from a peer's bookkeeping after that peer vanished (a
  // controller killed first), and then the worker's thread waits forever for the last reference
  // (seen: SIGTERM after the controller's exit hung about one time in three). Nothing is left to
  // save once the stages have stopped, so a shutdown that takes longer than this ends the process.
  std::mutex mutex;
  std::condition_variable stopped;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock lock(mutex);
    if (!stopped.wait_for(lock, std::chrono::seconds(3), [&] { return done; })) {
      spdlog::warn("node {}: the actor system did not finish stopping within 3 s; exiting", options.name);
      spdlog::shutdown();
      std::_Exit(0);
    }
  });
  n.reset();
  {
    std::lock_guard lock(mutex);
    done = true;
  }
  stopped.notify_all();
  watchdog.join();
}

}  // namespace troupe
