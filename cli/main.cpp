// troupe: serve, generate, tokenize, make-model, complete, chat ... one binary for every role.

#include <exception>
#include <memory>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "backends/cpu/blas_core.hpp"
#include "cli/command_registry.hpp"
#include "net/open_files.hpp"

namespace troupe::cli {
std::vector<command_factory>& command_factories() {
  static std::vector<command_factory> factories;
  return factories;
}
}  // namespace troupe::cli

int main(int argc, char** argv) {
  // Before anything else: OpenBLAS's kernels are chosen as the library loads, and a CPU it does
  // not know gets SSE3 ones (backends/cpu/blas_core.hpp); this starts over with the right ones.
  troupe::cpu::restart_with_blas_settings(argv);
  // Logs go to stderr: stdout carries only a command's output (ids, generated text), so it can
  // be piped or compared.
  spdlog::set_default_logger(spdlog::stderr_color_mt("troupe"));
  CLI::App app{"troupe: serves large language models, one actor per stage of inference"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "troupe 0.1.0");
  std::vector<troupe::cli::command> commands;
  for (auto& factory : troupe::cli::command_factories()) commands.push_back(factory(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& command : commands) {
    if (!command.app->parsed()) continue;
    const std::string& name = command.app->get_name();
    if (name == "serve" || name == "launch" || name == "node") {
      // A server's descriptors are shared by its doors, its links and its files: the soft limit
      // (often 1024) is raised to the hard one, and each door takes only a share (net/open_files.hpp).
      const troupe::open_files_raise raised = troupe::raise_open_files_limit();
      if (raised.after.soft != raised.before.soft) {
        spdlog::info("open-files limit raised from {} to {} (the hard limit)", raised.before.soft, raised.after.soft);
      } else {
        spdlog::info("open-files limit {} (hard limit {})", raised.after.soft, raised.after.hard);
      }
    }
    try {
      return command.run();
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      return 1;
    }
  }
  return 0;
}
