#pragma once
// A one-line progress bar on stderr for loading big models. It draws only when stderr is a
// terminal; otherwise, for big jobs, it logs a line per 25 % so service logs stay short.

#include <cstdint>
#include <string>

namespace troupe {

class progress_bar {
 public:
  // `enabled` false silences it completely (tests, small models).
  progress_bar(std::string label, uint64_t total, bool enabled);
  ~progress_bar();
  void advance(uint64_t amount);
  void finish();

 private:
  void draw();
  std::string label_;
  uint64_t total_ = 0;
  uint64_t done_ = 0;
  bool enabled_ = false;
  bool tty_ = false;
  int last_quarter_ = -1;
  int last_percent_ = -1;
  bool finished_ = false;
};

}  // namespace troupe
