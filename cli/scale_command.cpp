// troupe scale: add, drain or list the engine instances of a running controller through its
// admin door ([cluster] admin_listen), as a member of the cluster (mutual TLS).

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "cli/command_registry.hpp"
#include "node/admin_client.hpp"

namespace troupe::cli {
namespace {

struct scale_flags {
  std::string controller;
  std::string credentials;
  std::string name;
  std::optional<std::string> add;
  std::string role = "mixed";
  std::optional<int32_t> drain;
  std::optional<std::string> drain_node;
  int drain_timeout_ms = 0;
  bool list = false;
  std::optional<int> timeout_ms;
  int connect_timeout_ms = 10000;
};

// Adding waits for the node to load the model; the others answer at once.
constexpr int add_timeout_ms = 60000;
constexpr int request_timeout_ms = 30000;

int run(const scale_flags& flags) {
  admin_client_options options;
  parse_controller_address(flags.controller, options);
  options.credentials_dir = flags.credentials;
  options.name = flags.name;
  if (flags.connect_timeout_ms <= 0) throw std::invalid_argument("--connect-timeout-ms must be positive");
  if (flags.timeout_ms && *flags.timeout_ms <= 0) throw std::invalid_argument("--timeout-ms must be positive");
  options.connect_timeout = std::chrono::milliseconds(flags.connect_timeout_ms);
  const auto timeout =
      std::chrono::milliseconds(flags.timeout_ms.value_or(flags.add ? add_timeout_ms : request_timeout_ms));
  admin_client admin(options);
  if (flags.add) {
    std::cout << "added " << admin.add_engine(*flags.add, timeout, flags.role) << "\n";
  } else if (flags.drain) {
    admin.drain_engine(*flags.drain, timeout);
    std::cout << "draining engine instance " << *flags.drain << ": it stops once its last request ends\n";
  } else if (flags.drain_node) {
    if (flags.drain_timeout_ms < 0) throw std::invalid_argument("--drain-timeout-ms must be 0 or more");
    const std::vector<engine_instance_id> ids =
        admin.drain_node(*flags.drain_node, std::chrono::milliseconds(flags.drain_timeout_ms), timeout);
    std::string list;
    for (engine_instance_id id : ids) list += (list.empty() ? "" : ", ") + std::to_string(id);
    std::cout << "draining node " << *flags.drain_node << " (engine instances " << list << "): "
              << (flags.drain_timeout_ms > 0
                      ? "each stops once its last request ends, or after " + std::to_string(flags.drain_timeout_ms) +
                            " ms with the rest re-run elsewhere"
                      : std::string("each stops once its last request ends"))
              << "\n";
  } else {
    for (const std::string& line : admin.list_engines(timeout)) std::cout << line << "\n";
  }
  return 0;
}

const bool registered = register_command([](CLI::App& parent) {
  auto f = std::make_shared<scale_flags>();
  auto* app = parent.add_subcommand(
      "scale", "add, drain or list the engine instances of a running controller (its [cluster] admin_listen)");
  app->add_option("--controller", f->controller, "HOST:PORT of the controller's admin door")->required();
  // Not marked required for CLI11: a missing one gets the reason, not just the flag's name.
  app->add_option("--credentials", f->credentials,
                  "credentials directory from `troupe certs` (ca.crt, NAME.crt, NAME.key)");
  app->add_option("--name", f->name, "this member's name in the credentials (NAME.crt)")->required();
  auto* add = app->add_option("--add", f->add, "place a new engine instance on this node (a [[nodes]] name)");
  app->add_option("--role", f->role, "with --add: the new instance's role (mixed, prefill or decode)")
      ->check(CLI::IsMember({"mixed", "prefill", "decode"}))
      ->capture_default_str();
  auto* drain = app->add_option("--drain", f->drain, "stop routing requests to this instance id; it stops when idle");
  auto* drain_node = app->add_option("--drain-node", f->drain_node,
                                     "drain every engine instance on this node (take the node out of service)");
  auto* drain_timeout = app->add_option("--drain-timeout-ms", f->drain_timeout_ms,
                                        "with --drain-node: after this long, re-run the requests still there on "
                                        "other instances and stop (0: wait for them to end)")
                            ->capture_default_str();
  drain_timeout->needs(drain_node);
  auto* list = app->add_flag("--list", f->list, "print one line per engine instance");
  add->excludes(drain)->excludes(drain_node)->excludes(list);
  drain->excludes(drain_node)->excludes(list);
  drain_node->excludes(list);
  app->add_option("--timeout-ms", f->timeout_ms,
                  "wait this long for the answer (default: 60000 for --add, else 30000)");
  app->add_option("--connect-timeout-ms", f->connect_timeout_ms, "wait this long for the connection")
      ->capture_default_str();
  app->callback([app] {
    if (app->count("--add") + app->count("--drain") + app->count("--drain-node") + app->count("--list") == 0) {
      throw CLI::ValidationError("troupe scale", "give one of --add NODE, --drain ID or --list (or --drain-node NODE)");
    }
  });
  return command{app, [f] { return run(*f); }};
});

}  // namespace
}  // namespace troupe::cli
