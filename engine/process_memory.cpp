#include "engine/process_memory.hpp"

#include <dlfcn.h>
#include <malloc.h>

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

void return_freed_memory() {
  using mallctl_function = int (*)(const char*, void*, size_t*, void*, size_t);
  if (auto mallctl = reinterpret_cast<mallctl_function>(dlsym(RTLD_DEFAULT, "mallctl"))) {
    // 4096 is MALLCTL_ARENAS_ALL: every arena.
    mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);
    return;
  }
  malloc_trim(0);
}

}  // namespace troupe
