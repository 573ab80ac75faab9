#pragma once
// How busy each pipeline stage of this process's pipelined model has been lately: the share of
// the last 10 s each stage spent computing, what `troupe scale --list` shows per stage (the
// rest of the time a stage waited: for its input, for the link, or for work). A remote stage's
// compute time comes in its result frames (stage_frame_header::compute_us), the local stage's
// is timed where it runs. Like stage_health_board, the process's: the pipelined model runs in
// the worker, and the scheduler of the same engine answers the stats query that reads it. The
// board also keeps each remote stage's process CPU (its result frames carry it), so that /metrics
// and `troupe plan` count the stage processes beside the cluster's others.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "model/layer_range.hpp"

namespace troupe {

struct stage_busy {
  layer_range layers;       // resolved: [first, end)
  std::string where;        // the stage's endpoint, or "here" for the engine's own layers
  double busy_share = 0.0;  // of the window (or of the time since the stage was first seen)
};

// A remote stage's process and its CPU since it began serving, as its last result frame said.
struct stage_process_cpu {
  std::string process;  // "HOST:PID", the host as the stage's endpoint names it
  double total_s = 0;
  double compute_s = 0;
};

// "HOST:PID" of a stage at `endpoint` (kvtcp://HOST:PORT or curve://HOST:PORT/KEY).
std::string stage_process_identity(const std::string& endpoint, uint32_t pid);

class stage_load_board {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds window{10};

  // The process's board.
  static stage_load_board& instance();

  // The stage of `layers` at `where` computed for `busy` in work that ended by `now`.
  void add(layer_range layers, const std::string& where, std::chrono::nanoseconds busy, clock::time_point now);
  // The stage is gone (its model was destroyed).
  void forget(layer_range layers, const std::string& where);
  // Every stage known, in layer order, with its busy share at `now`.
  std::vector<stage_busy> shares(clock::time_point now) const;
  // The CPU of the remote stage of `layers` at `where`, as its process last reported it.
  void report_cpu(layer_range layers, const std::string& where, stage_process_cpu cpu);
  // Every remote stage's process whose CPU is known, in layer order (forget() drops it too).
  std::vector<stage_process_cpu> processes() const;

 private:
  struct stage {
    clock::time_point first_seen;
    std::deque<std::pair<clock::time_point, std::chrono::nanoseconds>> recent;  // within the window
  };
  using key = std::pair<int, std::string>;  // first layer, where
  static void prune(stage& s, clock::time_point now);

  mutable std::mutex mutex_;
  std::map<key, std::pair<layer_range, stage>> stages_;
  std::map<key, stage_process_cpu> processes_;
};

// "0-3:41.2%,4-7:38.0%": the layers (inclusive, as topologies write them) and busy share of each
// stage, for a `troupe scale --list` line; "" for none.
std::string stage_busy_text(const std::vector<stage_busy>& stages);

}  // namespace troupe
