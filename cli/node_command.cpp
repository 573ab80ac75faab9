// troupe node: an empty node that a controller places stages on, reached over mutual TLS only.

#include <chrono>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "cli/command_registry.hpp"
#include "doors/operator_log.hpp"
#include "node/remote_node.hpp"
#include "node/topology.hpp"

namespace troupe::cli {
namespace {

struct node_flags {
  std::string listen;
  std::string credentials;
  std::string name;
  std::string log_level = "info";
  std::string log_format = "text";  // applied while the command line is parsed
  int64_t handshake_timeout_ms = 5000;
  size_t max_pending_handshakes = 64;
  size_t max_connections = 256;
  size_t max_message_mb = 64;
};

int run(const node_flags& flags) {
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  remote_node_options options;
  options.credentials_dir = flags.credentials;
  options.name = flags.name;
  parse_listen_address(flags.listen, options);
  options.tls.connections.handshake_timeout = std::chrono::milliseconds(flags.handshake_timeout_ms);
  options.tls.connections.max_pending = flags.max_pending_handshakes;
  options.tls.connections.max_connections = flags.max_connections;
  if (flags.max_message_mb < 1 || flags.max_message_mb > 4096) {
    throw std::invalid_argument("--max-message-mb must be in 1..4096, got " + std::to_string(flags.max_message_mb));
  }
  options.tls.max_message_bytes = flags.max_message_mb << 20;
  check_tls_limits(options.tls, "");
  run_node_until_signal(options);
  return 0;
}

const bool registered = register_command([](CLI::App& parent) {
  auto f = std::make_shared<node_flags>();
  auto* app = parent.add_subcommand(
      "node", "start an empty node: it loads nothing until a controller spawns stages on it (mutual TLS only)");
  app->add_option("--listen", f->listen, "HOST:PORT to accept controllers on (PORT 0: any free port, logged)")
      ->required();
  // Not marked required for CLI11: a missing one gets the reason, not just the flag's name.
  app->add_option("--credentials", f->credentials,
                  "credentials directory from `troupe certs` (ca.crt, NAME.crt, NAME.key)");
  app->add_option("--name", f->name, "this member's name in the credentials (NAME.crt), also the node's name")
      ->required();
  app->add_option("--log-level", f->log_level, "trace | debug | info | warn | error")->capture_default_str();
  app->add_option("--log-format", f->log_format, "text | json (one JSON object per log line)")
      ->capture_default_str()
      ->each([](const std::string& name) { set_log_format(parse_log_format(name)); });
  // The cluster port's bounds (as [cluster] sets the controller's): a connection that has not
  // finished its TLS handshake by then is closed; at most so many may be pending (the oldest is
  // closed for a newer one) and so many open; no CAF message above max_message_mb is read.
  app->add_option("--handshake-timeout-ms", f->handshake_timeout_ms, "a TLS handshake's deadline")
      ->capture_default_str();
  app->add_option("--max-pending-handshakes", f->max_pending_handshakes, "connections in their handshake at once")
      ->capture_default_str();
  app->add_option("--max-connections", f->max_connections, "open connections on the cluster port")
      ->capture_default_str();
  app->add_option("--max-message-mb", f->max_message_mb, "the largest CAF message read from a member")
      ->capture_default_str();
  return command{app, [f] { return run(*f); }};
});

}  // namespace
}  // namespace troupe::cli
