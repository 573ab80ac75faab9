#pragma once
// Each `troupe` subcommand lives in its own file and registers itself here at static
// initialization, so adding a command touches no other file.

#include <functional>
#include <vector>

#include <CLI/CLI.hpp>

namespace troupe::cli {

struct command {
  CLI::App* app = nullptr;   // the subcommand, with its options bound
  std::function<int()> run;  // called when the subcommand was given; returns the exit code
};

using command_factory = std::function<command(CLI::App& parent)>;

std::vector<command_factory>& command_factories();

inline bool register_command(command_factory factory) {
  command_factories().push_back(std::move(factory));
  return true;
}

}  // namespace troupe::cli
