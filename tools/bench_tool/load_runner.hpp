#pragma once
// Runs one load: sends each request at its arrival time (or as soon as one of `concurrency`
// slots is free), each from a worker thread of its own session, and gathers what each measured.

#include <cstdint>
#include <vector>

#include "tools/bench_tool/request_record.hpp"
#include "tools/bench_tool/server_client.hpp"
#include "tools/bench_tool/workload.hpp"

namespace troupe::bench_tool {

struct load_settings {
  double rate = 0;          // requests/s; infinity: all at once
  double burstiness = 1.0;  // the gamma shape of the gaps (1: Poisson)
  int concurrency = 0;      // requests in flight at most; 0: no bound
  uint64_t seed = 0;
  bool progress = false;  // a progress bar on stderr
};

struct load_result {
  std::vector<request_record> records;  // in the order of the requests
  double duration = 0;                  // the run's start -> its last reply, seconds
};

load_result run_load(server_client& server, const std::vector<bench_request>& requests, const load_settings& settings);

}  // namespace troupe::bench_tool
