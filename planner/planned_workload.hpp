#pragma once
// What `troupe plan` simulates: requests with an arrival time, a prompt length and an output
// length. Drawn like tools/bench draws a random run (the same length distributions and gamma
// arrivals), or read back from a run tools/bench recorded with --json, so a prediction can be
// set beside the measurement of the very same requests.

#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

struct planned_request {
  double arrival_s = 0;  // from the run's start
  int prompt_len = 0;
  int output_len = 0;
};

enum class planned_length_distribution { fixed, uniform, lognormal };
// "fixed", "uniform" or "lognormal"; throws std::invalid_argument naming the text otherwise.
planned_length_distribution parse_planned_length_distribution(const std::string& name);

// A length around `mean`: fixed; uniform in [mean(1 - spread), mean(1 + spread)]; lognormal with
// that mean and sigma = spread. Never below 1.
struct planned_length {
  int mean = 1;
  planned_length_distribution distribution = planned_length_distribution::fixed;
  double spread = 0;
};

// A class of requests in a mix: its share of the requests and its lengths (e.g. 80 % short chats,
// 20 % long prompts).
struct request_class {
  double share = 1;
  planned_length prompt;
  planned_length output;
};

// `count` requests at `rate` per second (gaps from a gamma distribution of shape `burstiness`:
// 1 is Poisson), each of a class drawn by share. Deterministic in `seed`. Throws
// std::invalid_argument for a non-positive count, rate or burstiness, or no class with a share.
std::vector<planned_request> draw_workload(const std::vector<request_class>& mix, int count, double rate,
                                           double burstiness, uint64_t seed);

// The requests a `tools/bench --json` run recorded (its "requests": start, prompt_tokens,
// output_tokens), in the order sent. Throws std::runtime_error naming the file and what is wrong.
std::vector<planned_request> load_bench_run(const std::string& path);

// The bench process's own CPU per request over that run (its summary's client_cpu_seconds over
// num_requests): what the client took from cores it shared with the server. 0 when the run
// did not record it; throws std::runtime_error naming the file when it is not a number.
double bench_run_client_cpu_per_request(const std::string& path);

// The same requests at another rate: arrival times scaled by from_rate / to_rate.
std::vector<planned_request> at_rate(std::vector<planned_request> requests, double from_rate, double to_rate);

}  // namespace troupe
