#pragma once
// Small pieces every benchmark command line shares: comma-separated counts, the machine's load
// average (printed beside each figure because other work on a shared machine moves them) and the
// process's memory.

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace troupe::bench {

// "1,16,64" -> {1, 16, 64}; std::stoi names a malformed item by throwing.
inline std::vector<int> parse_list(const std::string& text) {
  std::vector<int> values;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) values.push_back(std::stoi(item));
  return values;
}

// The 1-minute load average from /proc/loadavg, or -1 where it cannot be read.
inline double load_average() {
  double load = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  return load;
}

// A field of /proc/self/status in MB (VmRSS: resident now, VmHWM: the peak so far), or -1.
inline double process_memory_mb(const char* field) {
  double kb = -1;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    const std::string prefix = std::string(field) + ":";
    while (std::fgets(line, sizeof line, f)) {
      if (std::string(line).rfind(prefix, 0) == 0) {
        std::sscanf(line + prefix.size(), "%lf", &kb);
        break;
      }
    }
    std::fclose(f);
  }
  return kb < 0 ? -1 : kb * 1024 / 1e6;
}

}  // namespace troupe::bench
