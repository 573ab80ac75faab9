// troupe launch FILE: every [[nodes]] entry on this machine as a child `troupe node` (or, for a
// node that runs a [pipeline] stage, a child `troupe stage`), then the controller as a child
// `troupe serve --config FILE` with launch's own serve flags; a child that dies is started again
// (node/node_supervisor.hpp), the controller too. A signal stops the controller (its drain runs
// with the nodes still up), then the nodes. Launch ends when the controller stays down for good.

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <vector>

#include <spdlog/spdlog.h>

#include "cli/command_registry.hpp"
#include "cli/serve_flags.hpp"
#include "model/layer_range.hpp"
#include "node/launch_credentials.hpp"
#include "node/local_host.hpp"
#include "node/node_launcher.hpp"
#include "node/node_supervisor.hpp"
#include "node/pipeline_placement.hpp"
#include "node/topology_files.hpp"

namespace troupe::cli {
namespace {

constexpr auto node_start_timeout = std::chrono::seconds(30);
// The controller loads the model before its doors open: a large one takes minutes.
constexpr auto controller_start_timeout = std::chrono::minutes(10);
// Past the drain timeout, the controller's last replies and its shutdown.
constexpr auto controller_stop_margin = std::chrono::seconds(10);

// The nodes log at least at info level: their `listening on` line is how launch sees them up.
std::string node_log_level(const std::string& level) { return level == "trace" || level == "debug" ? level : "info"; }

bool signal_pending(const sigset_t& signals) {
  sigset_t pending;
  sigpending(&pending);
  return sigismember(&pending, SIGINT) || sigismember(&pending, SIGTERM);
}

// The controller's command line: the serve flags launch was given, the --set overrides launch
// added (a private CA), and a log level that shows the line launch waits for.
std::vector<std::string> controller_args(const CLI::App& app, const serve_flags& given, const serve_flags& flags) {
  std::vector<std::string> args;
  const std::vector<std::string> forwarded = given_serve_flags(app);
  for (size_t i = 0; i < forwarded.size(); ++i) {
    if (forwarded[i] == "--log-level" && i + 1 < forwarded.size()) {
      ++i;
      continue;
    }
    args.push_back(forwarded[i]);
  }
  for (size_t i = given.overrides.size(); i < flags.overrides.size(); ++i) {
    args.insert(args.end(), {"--set", flags.overrides[i]});
  }
  args.insert(args.end(), {"--log-level", node_log_level(flags.log_level)});
  return args;
}

// Waits for SIGINT or SIGTERM (0) or for the controller to stay down for good (1: nothing serves
// without it, so launch ends and says why).
int wait_for_signal_or_lost_controller(const sigset_t& signals, const node_supervisor& controller) {
  for (;;) {
    timespec tick{0, 100'000'000};
    if (sigtimedwait(&signals, nullptr, &tick) > 0) return 0;
    const std::vector<std::string> down = controller.down();
    if (!down.empty()) {
      spdlog::error("the controller {} stays down: stopping the nodes and ending launch", down.front());
      return 1;
    }
  }
}

// A child logs in launch's format (its lines then pass through launch as JSON too).
void with_log_format(child_spec& spec, const std::string& format) {
  if (format != "text") spec.argv.insert(spec.argv.end(), {"--log-format", format});
}

// A TOML literal string ('...', no escapes) when it can be one, for a --set value.
std::string toml_string(const std::string& text) {
  if (text.find('\'') == std::string::npos) return "'" + text + "'";
  throw std::runtime_error("the state directory's path " + text + " has a ' in it: give another --state-dir");
}

// A local launch with no credentials gets its private CA (node/launch_credentials.hpp): the
// flags then name it as if the topology had ([cluster] credentials, through --set).
serve_flags with_private_credentials(const serve_flags& flags, const std::string& state_dir) {
  const std::filesystem::path file = flags.config;
  const topology as_read = load_topology_unvalidated(file, flags.overrides);
  const std::filesystem::path state =
      state_dir.empty() ? default_launch_state_dir(file) : std::filesystem::absolute(state_dir);
  const std::optional<launch_credentials> made = local_launch_credentials(as_read, state, flags.config);
  if (!made) return flags;
  if (made->made_ca || made->num_issued > 0) {
    spdlog::info(
        "no [cluster] credentials and every member runs here: {} certificates for {} members in {} (a "
        "cluster with nodes on other machines needs `troupe certs`)",
        made->made_ca ? "made a private CA and" : "issued from the private CA", made->num_issued, made->dir.string());
  } else {
    spdlog::info("no [cluster] credentials and every member runs here: using the private CA made earlier in {}",
                 made->dir.string());
  }
  serve_flags out = flags;
  out.overrides.push_back("cluster.credentials=" + toml_string(made->dir.string()));
  return out;
}

int run(const serve_flags& given, const std::string& state_dir, const CLI::App& app) {
  spdlog::set_level(spdlog::level::from_str(given.log_level));
  if (given.batch_invariant) {
    throw std::runtime_error("--batch-invariant is a `troupe serve` flag: a launched topology's nodes do not take it");
  }
  const serve_flags flags = with_private_credentials(given, state_dir);
  const topology t = topology_from_flags(flags);
  // Blocked before any thread starts (the launcher's readers, the controller's actors), so that
  // only the controller's sigwait, or the check below while the nodes start, sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // The files of every member that runs here, before any starts: a missing model path is named
  // now, not by a node that tries to load it after the others have started.
  std::set<std::string> members_here{t.cluster.name};
  for (const node_address& n : t.nodes) {
    if (is_local_host(n.host)) members_here.insert(n.name);
  }
  check_topology_files(t, members_here, flags.config);

  node_launcher launcher;  // stops every node it started when it ends, also on an exception
  std::vector<supervised_child> supervised;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  std::set<std::string> stage_nodes;
  for_each_placed_stage(t, [&](const remote_stage&, const std::string& node) { stage_nodes.insert(node); });
  for (const node_address& n : t.nodes) {
    if (stage_nodes.count(n.name)) continue;  // runs `troupe stage`, below
    const std::string address = n.host + ":" + std::to_string(n.port);
    if (!is_local_host(n.host)) {
      spdlog::info("node {} at {} is not this machine: start it there with `troupe node --listen {} --name {}`", n.name,
                   address, address, n.name);
      continue;
    }
    if (t.cluster.credentials.empty()) {
      throw std::runtime_error(flags.config + ": [cluster] credentials is required to launch node " + n.name +
                               " (nodes accept only mutual TLS; make them with `troupe certs`)");
    }
    supervised_child child{node_child_spec(n, t.cluster.credentials, self, node_log_level(flags.log_level)), n.restart};
    with_log_format(child.spec, flags.log_format);
    child.pid = launcher.start(child.spec);
    supervised.push_back(std::move(child));
  }
  // The pipeline's stages before the controller, whose engine connects to them as it starts.
  for (stage_process& p : local_stage_processes(t, self, node_log_level(flags.log_level))) {
    supervised_child child{std::move(p.spec), p.restart};
    with_log_format(child.spec, flags.log_format);
    child.pid = launcher.start(child.spec);
    supervised.push_back(std::move(child));
  }
  for_each_placed_stage(t, [&](const remote_stage& stage, const std::string& node) {
    const node_address* n = t.find_node(node);
    if (n && !is_local_host(n->host)) {
      spdlog::info(
          "pipeline stage {} on node {} at {}:{} is not this machine: start it there with `troupe stage "
          "--layers {} --host {} --port {}`",
          layer_range_text(stage.layers), n->name, n->host, n->port, layer_range_text(stage.layers), n->host, n->port);
    }
  });
  auto interrupted = [&] { return signal_pending(signals); };
  if (!launcher.wait_until_ready(node_start_timeout, interrupted)) {
    spdlog::info("signal while the nodes started: stopping them");
    return 0;
  }
  // From here a node that dies is started again as its [[nodes]] restart says; the controller
  // places its stages on it again when it is back.
  node_supervisor supervisor(launcher, std::move(supervised));

  // The controller, a child like the nodes so that it can be started again: a restarted one
  // takes the nodes back (their stages of the dead one ended with it, node/stage_owner.hpp).
  node_launcher controller_launcher;
  supervised_child controller{controller_child_spec(t.cluster.name, std::filesystem::absolute(flags.config), self,
                                                    controller_args(app, given, flags)),
                              t.cluster.restart};
  controller.pid = controller_launcher.start(controller.spec);
  if (!controller_launcher.wait_until_ready(controller_start_timeout, interrupted)) {
    spdlog::info("signal while the controller started: stopping it and the nodes");
    controller_launcher.stop();
    launcher.stop();
    return 0;
  }
  node_supervisor controller_supervisor(controller_launcher, {controller});
  const int code = wait_for_signal_or_lost_controller(signals, controller_supervisor);
  // The controller first, given its drain (running requests finish on the nodes), then the
  // nodes. Each launcher before its supervisor: the children a supervisor restarted are tied to
  // its thread, and a stopping launcher starts none. A second signal ends the drain now.
  controller_launcher.stop(std::chrono::seconds(t.drain_timeout_s) + controller_stop_margin, interrupted);
  controller_supervisor.stop();
  launcher.stop();
  supervisor.stop();
  return code;
}

const bool registered = register_command([](CLI::App& parent) {
  auto flags = std::make_shared<serve_flags>();
  auto* app = parent.add_subcommand(
      "launch",
      "run a whole topology: start its [[nodes]] on this machine, then the controller (`serve --config FILE`), and "
      "start again any that dies");
  app->add_option("file", flags->config, "topology file (TOML), e.g. config/replicas-2.toml")->required();
  add_serve_flags(*app, *flags);
  auto state_dir = std::make_shared<std::string>();
  app->add_option("--state-dir", *state_dir,
                  "where launch keeps its state (a local launch's private CA); default: "
                  "$XDG_STATE_HOME or ~/.local/state, then troupe/launch/STEM-HASH");
  return command{app, [flags, state_dir, app] { return run(*flags, *state_dir, *app); }};
});

}  // namespace
}  // namespace troupe::cli
