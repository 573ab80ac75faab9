#pragma once
// --sweep: the same load at each value of one setting, the request rate or a server flag (the
// server restarted per value), written as a CSV table and SVG plots.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tools/bench_tool/run_summary.hpp"

namespace troupe::bench_tool {

struct sweep_spec {
  std::string key;                  // "rate", or a server setting such as max-num-batched-tokens
  std::vector<std::string> values;  // as given, for the server command and the labels
  bool is_rate() const { return key == "rate"; }
};

// "rate=1,2,4" or "max-num-batched-tokens=256,512"; an error names what is wrong.
sweep_spec parse_sweep(const std::string& text);

struct sweep_row {
  std::string value;
  int round = 0;
  run_summary summary;
  std::optional<double> goodput_rate;  // with --find-goodput: the rate found at this value
};

// Per value, in the order given, the round with the lowest median E2E (the one least disturbed by
// other load on the machine); values with no completed request in any round are left out.
std::vector<sweep_row> best_rounds(const sweep_spec& spec, const std::vector<sweep_row>& rows);

// Every round's row.
std::string sweep_csv(const sweep_spec& spec, const std::vector<sweep_row>& rows);
// Reads back a sweep.csv this tool wrote (for --replot); an error names the file and line.
std::pair<sweep_spec, std::vector<sweep_row>> read_sweep_csv(const std::string& path);

// Writes sweep.csv (every round) and the plots (best rounds) into `dir` (created); returns the
// files written.
std::vector<std::string> write_sweep_outputs(const std::string& dir, const sweep_spec& spec,
                                             const std::vector<sweep_row>& rows, bool with_slo);

}  // namespace troupe::bench_tool
