// troupe serve: one node with every stage, from a topology file and flags that override it.

#include <memory>

#include <spdlog/spdlog.h>

#include "backends/cpu/matmul.hpp"
#include "cli/command_registry.hpp"
#include "cli/serve_flags.hpp"
#include "node/node.hpp"

namespace troupe::cli {
namespace {

const bool registered = register_command([](CLI::App& parent) {
  auto flags = std::make_shared<serve_flags>();
  auto* app =
      parent.add_subcommand("serve", "serve a model on the ZeroMQ client plane and the OpenAI-compatible HTTP API");
  app->add_option("--config", flags->config, "topology file (TOML), e.g. config/colocated.toml");
  add_serve_flags(*app, *flags);
  return command{app, [flags] {
                   spdlog::set_level(spdlog::level::from_str(flags->log_level));
                   if (flags->batch_invariant) {
                     // Process-wide and before any model is built: the KV cache's default dtype follows it.
                     cpu::set_matmul_float_rows_at_every_count(true);
                     spdlog::info("batch invariant: float weights take the row dots at every batch size");
                   }
                   serve_until_signal(topology_from_flags(*flags));
                   return 0;
                 }};
});

}  // namespace
}  // namespace troupe::cli
