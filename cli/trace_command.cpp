// troupe trace: fetches the last N seconds of a running server as a Chrome trace
// (GET /debug/trace?seconds=N on its HTTP door) and writes it to a file, for chrome://tracing,
// Perfetto (ui.perfetto.dev) or DevTools' performance panel.

#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cli/command_registry.hpp"

namespace troupe::cli {
namespace {

struct trace_flags {
  std::string endpoint = "http://127.0.0.1:8000";
  double seconds = 10;
  std::string out = "trace.json";
  std::string api_key;
};

int run_trace(const trace_flags& flags) {
  static const std::regex http_url(R"(https?://[^/\s]+)");
  if (!std::regex_match(flags.endpoint, http_url)) {
    std::cerr << "troupe trace: --endpoint '" << flags.endpoint
              << "' is not the server's HTTP address (http://host:port, no path)\n";
    return 2;
  }
  httplib::Client client(flags.endpoint);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(30, 0);
  if (!flags.api_key.empty()) client.set_bearer_token_auth(flags.api_key);
  auto res = client.Get("/debug/trace?seconds=" + std::to_string(flags.seconds));
  if (!res) {
    std::cerr << "troupe trace: cannot reach " << flags.endpoint << " (" << httplib::to_string(res.error())
              << " error): is troupe serve running there with --http-port?\n";
    return 1;
  }
  if (res->status != 200) {
    std::string message = res->body;
    try {
      message = nlohmann::json::parse(res->body).at("error").at("message").get<std::string>();
    } catch (const std::exception&) {
    }
    std::cerr << "troupe trace: the server answered " << res->status << ": " << message << "\n";
    return 1;
  }
  size_t num_requests = 0, num_steps = 0;
  try {
    const nlohmann::json trace = nlohmann::json::parse(res->body);
    for (const auto& e : trace.at("traceEvents")) {
      if (e.at("ph") != "X") continue;
      if (e.at("name") == "request") ++num_requests;
      if (e.at("pid").get<int>() >= 100) ++num_steps;
    }
  } catch (const std::exception& e) {
    std::cerr << "troupe trace: the server's answer is not a Chrome trace: " << e.what() << "\n";
    return 1;
  }
  std::ofstream file(flags.out, std::ios::binary);
  file << res->body;
  if (!file.flush()) {
    std::cerr << "troupe trace: cannot write " << flags.out << "\n";
    return 1;
  }
  std::cout << "wrote " << flags.out << ": " << num_requests << " requests and " << num_steps
            << " scheduler steps of the last " << flags.seconds << " s\n";
  return 0;
}

const bool registered = register_command([](CLI::App& parent) {
  auto flags = std::make_shared<trace_flags>();
  CLI::App* app = parent.add_subcommand("trace", "Fetch the last seconds of a running server as a Chrome trace");
  app->add_option("--endpoint", flags->endpoint, "the server's HTTP address (troupe serve --http-port)")
      ->capture_default_str();
  app->add_option("--seconds", flags->seconds, "how far back the trace reaches")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  app->add_option("--out", flags->out, "the file to write")->capture_default_str();
  app->add_option("--api-key", flags->api_key, "the key the server asks for (--api-key of troupe serve)");
  return command{app, [flags] { return run_trace(*flags); }};
});

}  // namespace
}  // namespace troupe::cli
