#pragma once
// Which remote pipeline stages of this process's pipelined models are down now, and why: what
// /health reports (503 naming the stage) while a stage is lost and its link reconnects. The
// pipelined model runs inside the worker and the scheduler answers /health's stats query, two
// actors of one engine instance in one process (a pipeline drives one engine, placed with its
// worker), so the board is the process's, not a message between them.

#include <map>
#include <mutex>
#include <string>

namespace troupe {

class stage_health_board {
 public:
  // The process's board.
  static stage_health_board& instance();

  // Stage `key` (its layers and endpoint) is down for `why`; replaces an earlier report.
  void down(const std::string& key, const std::string& why);
  // Stage `key` is back (or its model is gone).
  void up(const std::string& key);
  // Every stage down now, "KEY: WHY" joined by "; ", or "" when all are up.
  std::string down_text() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::string> down_;
};

}  // namespace troupe
