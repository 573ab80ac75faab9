// troupe chat: an interactive terminal chat with a running server, keeping the history.

#include <unistd.h>

#include <iostream>

#include "cli/command_registry.hpp"
#include "client/client.hpp"

namespace troupe::cli {
namespace {

struct chat_flags {
  std::string endpoint = "tcp://127.0.0.1:5557";
  std::string api_key;
  double connect_timeout = 5;   // seconds
  double request_timeout = 60;  // seconds
  std::string system;
  int max_tokens = 256;
  float temperature = 0.7f;
  float top_p = 0.95f;
};

const bool registered = register_command([](CLI::App& parent) {
  auto flags = std::make_shared<chat_flags>();
  auto* app = parent.add_subcommand("chat", "chat with a running server (one line per turn; /reset, /quit)");
  app->add_option("--endpoint", flags->endpoint, "server's ZeroMQ endpoint");
  app->add_option("--api-key", flags->api_key, "key the server asks for");
  app->add_option("--connect-timeout", flags->connect_timeout, "seconds to wait for a connection to the server")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--request-timeout", flags->request_timeout, "seconds to wait for each reply from the server")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--system", flags->system, "system message");
  app->add_option("--max-tokens", flags->max_tokens, "tokens per answer at most");
  app->add_option("--temperature", flags->temperature, "0: greedy");
  app->add_option("--top-p", flags->top_p, "1: off");
  return command{
      app, [flags] {
        client c(flags->endpoint, flags->api_key);
        c.set_connect_timeout(std::chrono::milliseconds(static_cast<int64_t>(flags->connect_timeout * 1000)));
        c.set_timeout(std::chrono::milliseconds(static_cast<int64_t>(flags->request_timeout * 1000)));
        std::vector<chat_message> history;
        if (!flags->system.empty()) history.push_back({"system", flags->system});
        const bool interactive = isatty(0);
        std::string line;
        for (;;) {
          if (interactive) std::cout << "> " << std::flush;
          if (!std::getline(std::cin, line) || line == "/quit") break;
          if (line == "/reset") {
            history.resize(flags->system.empty() ? 0 : 1);
            continue;
          }
          if (line.empty()) continue;
          history.push_back({"user", line});
          generate_request request;
          request.messages = history;
          request.sampling.max_tokens = flags->max_tokens;
          request.sampling.temperature = flags->temperature;
          request.sampling.top_p = flags->top_p;
          try {
            auto answer =
                c.generate(std::move(request), [](const delta_reply& delta) { std::cout << delta.text << std::flush; });
            std::cout << "\n";
            history.push_back({"assistant", answer.text});
          } catch (const client_error& e) {
            std::cout << "error: " << e.what() << "\n";
            history.pop_back();
          }
        }
        return 0;
      }};
});

}  // namespace
}  // namespace troupe::cli
