#include "node/admin_client.hpp"

#include <charconv>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "node/admin_door.hpp"
#include "node/cluster_credentials.hpp"
#include "node/node_inspector.hpp"
#include "node/tls_middleman.hpp"
#include "node/topology.hpp"
#include "stages/error_category.hpp"
#include "stages/stage_actors.hpp"

namespace troupe {

void parse_controller_address(const std::string& text, admin_client_options& options) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw std::invalid_argument("--controller '" + text + "': expected HOST:PORT, e.g. 127.0.0.1:4600");
  }
  const std::string port_text = text.substr(colon + 1);
  unsigned port = 0;
  const auto [end, problem] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || problem != std::errc() || end != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    throw std::invalid_argument("--controller '" + text + "': the port must be a number from 1 to 65535");
  }
  options.host = text.substr(0, colon);
  options.port = static_cast<uint16_t>(port);
}

namespace {

class admin_client_config : public caf::actor_system_config {
 public:
  admin_client_config() {
    load<caf::io::middleman>();
    set("logger.console", caf::atom("none"));
    set("scheduler.max-threads", static_cast<size_t>(2));  // one request at a time
    // The controller drops a connection silent for its connection_timeout_ms, and an --add
    // waits in silence while the node loads the model: heartbeat as a node does.
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(node_heartbeat_interval_ms)});
    // The one answer type that is not built in (drain_node_atom's ids), by the controller's name.
    add_message_type<std::vector<int32_t>>("std::vector<int32_t>");
    register_error_category(*this);  // the controller answers with the project's errors
  }
};

}  // namespace

struct admin_client::impl {
  admin_client_config config;
  caf::actor_system system;
  tls_middleman tls;  // destroyed just before the system
  caf::actor admin;
  std::string where;  // "the controller's admin door at HOST:PORT", for errors

  impl(const member_credentials& files, const tls_limits& limits) : system(config), tls(system, files, limits) {}

  // The controller's own words where it sent some (an error with a text), else CAF's rendering.
  std::string describe(const caf::error& error, std::chrono::milliseconds timeout) const {
    if (error == caf::sec::request_timeout) return "no answer within " + std::to_string(timeout.count()) + " ms";
    const caf::message& context = error.context();
    if (context.size() == 1 && context.match_element<std::string>(0)) return context.get_as<std::string>(0);
    return system.render(error);
  }

  // Sends one request and waits (at most `timeout`) for an answer of type T.
  template <class T, class... Ts>
  T ask(const std::string& what, std::chrono::milliseconds timeout, Ts&&... message) {
    caf::scoped_actor self(system);
    std::optional<T> answer;
    std::string failure;
    self->request(admin, timeout, std::forward<Ts>(message)...)
        .receive([&](T& value) { answer = std::move(value); },
                 [&](caf::error& error) { failure = describe(error, timeout); });
    if (!answer) throw std::runtime_error(what + ": " + failure);
    return std::move(*answer);
  }
};

admin_client::admin_client(const admin_client_options& options) {
  if (options.credentials_dir.empty()) {
    throw std::runtime_error(
        "--credentials is required: the admin door takes members of the cluster only (troupe certs)");
  }
  if (options.name.empty()) throw std::runtime_error("--name is required: the member whose certificate to use");
  if (options.host.empty()) throw std::runtime_error("--controller needs a host, e.g. 127.0.0.1:4600");
  const member_credentials files = credentials_in(options.credentials_dir, options.name);
  verify_member_credentials(files);
  // The connection's whole handshake (TCP, TLS, CAF's) within connect_timeout: a peer that
  // accepts and never answers is closed by the TLS plane's deadline.
  tls_limits limits;
  limits.connections.handshake_timeout = options.connect_timeout;
  impl_ = std::make_unique<impl>(files, limits);
  impl_->where = "the controller's admin door at " + options.host + ":" + std::to_string(options.port);
  std::string failure;
  const auto started = std::chrono::steady_clock::now();
  if (auto admin = tls_remote_actor(impl_->system, options.host, options.port,
                                    options.connect_timeout + std::chrono::seconds(1))) {
    impl_->admin = std::move(*admin);
  } else if (admin.error() == caf::sec::no_actor_published_at_port) {
    failure = "nothing is published on that port";
  } else if (std::chrono::steady_clock::now() - started >= options.connect_timeout) {
    // The handshake's deadline closed it: a peer that accepted and never answered.
    failure = "no answer within " + std::to_string(options.connect_timeout.count()) + " ms";
  } else {
    failure = impl_->describe(admin.error(), options.connect_timeout);
  }
  if (!impl_->admin) {
    throw std::runtime_error("cannot connect to " + impl_->where + " (is the controller running with [cluster] " +
                             "admin_listen there, and are these credentials of its CA?): " + failure);
  }
}

admin_client::~admin_client() = default;

std::string admin_client::add_engine(const std::string& node, std::chrono::milliseconds timeout,
                                     const std::string& role) {
  return impl_->ask<std::string>("adding a " + role + " engine instance on node '" + node + "' through " + impl_->where,
                                 timeout, scale_add_atom::value, node, role);
}

void admin_client::drain_engine(engine_instance_id id, std::chrono::milliseconds timeout) {
  const bool known = impl_->ask<bool>("draining engine instance " + std::to_string(id) + " through " + impl_->where,
                                      timeout, drain_engine_atom::value, id);
  if (!known) {
    throw std::runtime_error("the controller has no engine instance " + std::to_string(id) +
                             " (troupe scale --list shows them)");
  }
}

std::vector<engine_instance_id> admin_client::drain_node(const std::string& node, std::chrono::milliseconds deadline,
                                                         std::chrono::milliseconds timeout) {
  if (deadline.count() < 0 || deadline.count() > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("the drain's deadline must be 0 to " +
                                std::to_string(std::numeric_limits<int32_t>::max()) + " ms");
  }
  std::vector<int32_t> ids =
      impl_->ask<std::vector<int32_t>>("draining node '" + node + "' through " + impl_->where, timeout,
                                       drain_node_atom::value, node, static_cast<int32_t>(deadline.count()));
  if (ids.empty()) {
    throw std::runtime_error("the controller has no active engine instance on node '" + node +
                             "' (troupe scale --list shows them)");
  }
  return std::vector<engine_instance_id>(ids.begin(), ids.end());
}

std::vector<std::string> admin_client::list_engines(std::chrono::milliseconds timeout) {
  return impl_->ask<std::vector<std::string>>("listing the engine instances through " + impl_->where, timeout,
                                              list_engines_atom::value);
}

std::string admin_client::inspect(std::chrono::milliseconds timeout) {
  return impl_->ask<std::string>("inspecting the cluster through " + impl_->where, timeout, inspect_atom::value);
}

}  // namespace troupe
