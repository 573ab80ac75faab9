#include "engine/process_memory.hpp"

#include <fstream>
#include <string>

namespace troupe {

process_memory current_process_memory() {
  process_memory memory;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    // "VmRSS:	  123456 kB"
    auto kib = [&](const char* key) { return line.rfind(key, 0) == 0 ? std::stoull(line.substr(6)) << 10 : 0; };
    if (size_t v = kib("VmRSS:")) memory.resident_bytes = v;
    if (size_t v = kib("VmHWM:")) memory.peak_bytes = v;
  }
  return memory;
}

}  // namespace troupe
