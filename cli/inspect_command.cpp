// troupe inspect: every actor of every node of a running controller, live like top (or one
// snapshot with --once, as JSON with --json), through its admin door ([cluster] admin_listen) as
// a member of the cluster (mutual TLS), like troupe scale.

#include <pthread.h>

#include <algorithm>
#include <csignal>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command_registry.hpp"
#include "cli/terminal_screen.hpp"
#include "node/actor_metrics_text.hpp"
#include "node/admin_client.hpp"
#include "node/inspection.hpp"
#include "node/inspection_table.hpp"

namespace troupe::cli {
namespace {

struct inspect_flags {
  std::string controller;
  std::string credentials;
  std::string name;
  bool once = false;
  bool json = false;
  bool prometheus = false;
  std::string sort = "busy";
  int interval_ms = 1000;
  int timeout_ms = 5000;
  int connect_timeout_ms = 10000;
};

// The live view: a snapshot every interval, keys in between. Returns when q is pressed or a
// signal arrives; the terminal_screen puts the terminal back whichever way it ends.
int live_view(admin_client& admin, const inspect_flags& flags) {
  terminal_screen screen;
  inspect_column sort = column_named(flags.sort);
  std::optional<cluster_inspection> last;
  std::string problem;
  const auto timeout = std::chrono::milliseconds(flags.timeout_ms);
  // Bounded by the user (q, Ctrl-C) and by signals; each pass waits at most one interval.
  for (;;) {
    try {
      last = cluster_inspection_from_json(nlohmann::json::parse(admin.inspect(timeout)));
      problem.clear();
    } catch (const std::exception& e) {
      problem = e.what();  // shown above the last good snapshot; tried again next second
    }
    const auto redraw = [&] {
      std::vector<std::string> lines;
      if (!problem.empty()) lines.push_back(("controller: " + problem).substr(0, screen.width()));
      if (last) {
        for (std::string& line : render_inspection(*last, sort, screen.width(), screen.height() - lines.size())) {
          lines.push_back(std::move(line));
        }
      }
      screen.draw(lines);
    };
    redraw();
    const auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(flags.interval_ms);
    for (int keys = 0; keys < 1000 && !terminal_screen::interrupted(); ++keys) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      const std::optional<std::string> key = screen.read_key(left);
      if (!key || key->empty()) continue;
      if (*key == "q" || *key == "Q") return 0;
      const std::vector<inspect_column>& all = inspect_columns();
      const auto at = std::find(all.begin(), all.end(), sort) - all.begin();
      const auto size = static_cast<std::ptrdiff_t>(all.size());
      if (*key == "right") {
        sort = all[static_cast<size_t>((at + 1) % size)];
      } else if (*key == "left") {
        sort = all[static_cast<size_t>((at + size - 1) % size)];
      } else if (auto picked = column_for_key((*key)[0])) {
        sort = *picked;
      } else {
        continue;
      }
      redraw();  // the new order at once, from the snapshot in hand
    }
    if (terminal_screen::interrupted()) return 0;
  }
}

int run(const inspect_flags& flags) {
  admin_client_options options;
  parse_controller_address(flags.controller, options);
  options.credentials_dir = flags.credentials;
  options.name = flags.name;
  if (flags.connect_timeout_ms <= 0) throw std::invalid_argument("--connect-timeout-ms must be positive");
  if (flags.timeout_ms <= 0) throw std::invalid_argument("--timeout-ms must be positive");
  if (flags.interval_ms < 100) throw std::invalid_argument("--interval-ms must be at least 100");
  if ((flags.json || flags.prometheus) && !flags.once) {
    throw std::invalid_argument(std::string(flags.json ? "--json" : "--prometheus") +
                                " prints one snapshot: give --once with it");
  }
  if (flags.json && flags.prometheus) throw std::invalid_argument("give --json or --prometheus, not both");
  const inspect_column sort = column_named(flags.sort);  // checked before connecting
  options.connect_timeout = std::chrono::milliseconds(flags.connect_timeout_ms);
  const auto timeout = std::chrono::milliseconds(flags.timeout_ms);

  if (flags.once) {
    admin_client admin(options);
    const std::string json = admin.inspect(timeout);
    const cluster_inspection cluster = cluster_inspection_from_json(nlohmann::json::parse(json));
    if (flags.json) {
      std::cout << to_json(cluster).dump(2) << "\n";
    } else if (flags.prometheus) {
      std::cout << actor_metrics_text(cluster);
    } else {
      for (const std::string& line : render_inspection(cluster, sort, 160)) std::cout << line << "\n";
    }
    return 0;
  }
  // The signals are left to this thread (the client's threads inherit the mask), so a Ctrl-C
  // wakes the wait for a key here and the screen is put back before we exit.
  terminal_screen::catch_signals();
  sigset_t signals;
  sigemptyset(&signals);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, signal);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::unique_ptr<admin_client> admin;
  try {
    admin = std::make_unique<admin_client>(options);
  } catch (...) {
    pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
    throw;
  }
  pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
  return live_view(*admin, flags);
}

const bool registered = register_command([](CLI::App& parent) {
  auto f = std::make_shared<inspect_flags>();
  auto* app = parent.add_subcommand(
      "inspect", "watch every actor of every node of a running controller, like top (its [cluster] admin_listen)");
  app->add_option("--controller", f->controller, "HOST:PORT of the controller's admin door")->required();
  // Not marked required for CLI11: a missing one gets the reason, not just the flag's name.
  app->add_option("--credentials", f->credentials,
                  "credentials directory from `troupe certs` (ca.crt, NAME.crt, NAME.key)");
  app->add_option("--name", f->name, "this member's name in the credentials (NAME.crt)")->required();
  app->add_flag("--once", f->once, "print one snapshot and exit (a table, or JSON with --json)");
  app->add_flag("--json", f->json, "with --once: print the snapshot as JSON");
  app->add_flag("--prometheus", f->prometheus, "with --once: print the per-actor gauges in Prometheus's text format");
  app->add_option("--sort", f->sort,
                  "the column to sort by: node, stage, actor, mailbox, max, rate, busy, p50, p99, messages")
      ->capture_default_str();
  app->add_option("--interval-ms", f->interval_ms, "refresh the live view this often")->capture_default_str();
  app->add_option("--timeout-ms", f->timeout_ms, "wait this long for each snapshot")->capture_default_str();
  app->add_option("--connect-timeout-ms", f->connect_timeout_ms, "wait this long for the connection")
      ->capture_default_str();
  return command{app, [f] { return run(*f); }};
});

}  // namespace
}  // namespace troupe::cli
