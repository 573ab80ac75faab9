#pragma once
// The operator's periodic throughput line (as vLLM's "Avg prompt throughput ... Running ...
// GPU KV cache usage"): over each interval, prompt and generation tokens per second, requests
// finished, and, from the engine instances' stats answer (the router's fan-in, the same
// /metrics reads), requests running and waiting and the KV pool's use. Plain class: it is
// handed a sample per interval and says whether there is a line to print; an interval in which
// nothing happened (no token, no request finished, none running or waiting) prints none.

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "stages/stage_clock.hpp"

namespace troupe {

struct throughput_sample {
  timestamp_ns at = 0;
  uint64_t num_prompt_tokens = 0;      // totals since the start: of finished requests
  uint64_t num_generation_tokens = 0;  // of tokens streamed to the doors, as they pass
  uint64_t num_finished = 0;           // requests finished, aborted or failed
  // The engine instances' gauges, summed; not known when they did not answer (a drain's end,
  // no engine left).
  bool has_engine_gauges = false;
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t num_free_blocks = 0;
  int32_t num_total_blocks = 0;
};

struct throughput_line {
  double seconds = 0;  // the interval's length
  double prompt_tokens_per_s = 0;
  double generation_tokens_per_s = 0;
  uint64_t num_finished = 0;  // in the interval
  bool has_engine_gauges = false;
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  double kv_used_percent = 0;
};

class throughput_log {
 public:
  // The line for the interval since the previous sample; nullopt for the first sample and for an
  // interval in which nothing happened.
  std::optional<throughput_line> next(const throughput_sample& sample);

 private:
  std::optional<throughput_sample> previous_;
};

// `throughput: prompt 120.0 tok/s, generation 450.3 tok/s, 5 finished over 10.0 s; running 3,
// waiting 0; KV cache 12.5% used`
std::string throughput_log_text(const throughput_line& line);
nlohmann::json throughput_log_fields(const throughput_line& line);

}  // namespace troupe
