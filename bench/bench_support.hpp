#pragma once
// Small pieces every benchmark command line shares: comma-separated counts and the machine's
// load average, printed beside each figure because other work on a shared machine moves them.

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

}  // namespace troupe::bench
