// troupe node: an empty node that a controller places stages on, reached over mutual TLS only.

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "cli/command_registry.hpp"
#include "node/remote_node.hpp"

namespace troupe::cli {
namespace {

struct node_flags {
  std::string listen;
  std::string credentials;
  std::string name;
  std::string log_level = "info";
};

int run(const node_flags& flags) {
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  remote_node_options options;
  options.credentials_dir = flags.credentials;
  options.name = flags.name;
  parse_listen_address(flags.listen, options);
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
  app->add_option("--credentials", f->credentials, "credentials directory from `troupe certs` (ca.crt, NAME.crt, NAME.key)");
  app->add_option("--name", f->name, "this member's name in the credentials (NAME.crt), also the node's name")->required();
  app->add_option("--log-level", f->log_level, "trace | debug | info | warn | error")->capture_default_str();
  return command{app, [f] { return run(*f); }};
});

}  // namespace
}  // namespace troupe::cli
