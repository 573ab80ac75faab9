// troupe complete: sends one prompt to a running server and streams the text to stdout.

#include <iostream>

#include "cli/command_registry.hpp"
#include "client/client.hpp"

namespace troupe::cli {
namespace {

struct complete_flags {
  std::string endpoint = "tcp://127.0.0.1:5557";
  std::string api_key;
  double connect_timeout = 5;   // seconds
  double request_timeout = 60;  // seconds
  std::string prompt;
  int max_tokens = 64;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  int64_t seed = -1;
  int num_speculative_tokens = -1;
  bool ignore_eos = false;
  bool show_usage = false;
  std::vector<std::string> stop;
};

const bool registered = register_command([](CLI::App& parent) {
  auto flags = std::make_shared<complete_flags>();
  auto* app = parent.add_subcommand("complete", "stream one completion from a running server");
  app->add_option("--endpoint", flags->endpoint, "server's ZeroMQ endpoint");
  app->add_option("--api-key", flags->api_key, "key the server asks for");
  app->add_option("--connect-timeout", flags->connect_timeout, "seconds to wait for a connection to the server")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--request-timeout", flags->request_timeout, "seconds to wait for each reply from the server")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--prompt", flags->prompt, "prompt text")->required();
  app->add_option("--max-tokens", flags->max_tokens, "tokens to generate at most");
  app->add_option("--temperature", flags->temperature, "0: greedy");
  app->add_option("--top-k", flags->top_k, "0: off");
  app->add_option("--top-p", flags->top_p, "1: off");
  app->add_option("--seed", flags->seed, "sampling seed (reproducible samples)");
  app->add_option("--stop", flags->stop, "text that ends the completion, not printed (repeatable)");
  app->add_option("--num-speculative-tokens", flags->num_speculative_tokens,
                  "speculative decoding: draft tokens verified per step, up to 16 (0: off; -1: the server's default)");
  app->add_flag("--ignore-eos", flags->ignore_eos, "keep going past end of text");
  app->add_flag("--usage", flags->show_usage, "print token counts and timings to stderr");
  return command{
      app, [flags] {
        client c(flags->endpoint, flags->api_key);
        c.set_connect_timeout(std::chrono::milliseconds(static_cast<int64_t>(flags->connect_timeout * 1000)));
        c.set_timeout(std::chrono::milliseconds(static_cast<int64_t>(flags->request_timeout * 1000)));
        generate_request request;
        request.prompt = flags->prompt;
        request.sampling.max_tokens = flags->max_tokens;
        request.sampling.temperature = flags->temperature;
        request.sampling.top_k = flags->top_k;
        request.sampling.top_p = flags->top_p;
        request.sampling.ignore_eos = flags->ignore_eos;
        request.sampling.stop = flags->stop;
        request.sampling.num_speculative_tokens = flags->num_speculative_tokens;
        if (flags->seed >= 0) request.sampling.seed = static_cast<uint64_t>(flags->seed);
        auto result =
            c.generate(std::move(request), [](const delta_reply& delta) { std::cout << delta.text << std::flush; });
        std::cout << "\n";
        if (flags->show_usage) {
          std::cerr << "finish " << result.finish_reason << ", prompt " << result.usage.prompt_tokens
                    << " tokens, completion " << result.usage.completion_tokens << " tokens, ttft "
                    << result.timings.ttft * 1e3 << " ms, tpot " << result.timings.tpot * 1e3 << " ms, e2e "
                    << result.timings.e2e * 1e3 << " ms\n";
          if (const auto& s = result.usage.speculative) {
            std::cerr << "speculative: " << s->draft_tokens << " draft tokens, " << s->accepted_tokens << " accepted ("
                      << s->acceptance_rate * 100 << " %), " << s->tokens_per_step << " tokens per step\n";
          }
        }
        return 0;
      }};
});

}  // namespace
}  // namespace troupe::cli
