#pragma once
// When each request is sent, as offsets in seconds from the run's start: the gaps are drawn from
// a gamma distribution with shape `burstiness` and mean 1 / rate (vLLM's benchmark_serving):
// burstiness 1 is a Poisson process, below 1 burstier, above 1 more even (large values come
// close to a fixed interval). An infinite rate sends everything at once.

#include <cstdint>
#include <vector>

namespace troupe::bench_tool {

std::vector<double> arrival_offsets(int num_requests, double rate, double burstiness, uint64_t seed);

}  // namespace troupe::bench_tool
