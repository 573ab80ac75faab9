#include "engine/process_cpu.hpp"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

namespace troupe {

namespace {

std::atomic<int64_t> step_cpu_ns{0};

std::mutex serving_began_mutex;
process_cpu_time cpu_when_serving_began;
bool serving_began = false;

double clock_seconds(clockid_t clock) {
  timespec t{};
  if (clock_gettime(clock, &t) != 0) return 0;
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// utime + stime of one thread from its stat line; the name in parentheses may hold spaces, so
// the fields are counted from its closing parenthesis.
double thread_stat_seconds(const std::filesystem::path& task) {
  std::ifstream in(task / "stat");
  std::string line;
  if (!std::getline(in, line)) return 0;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  // After the name: state is field 3, utime 14 and stime 15.
  for (int i = 3; i < 14 && fields >> field; ++i) {
  }
  unsigned long long utime = 0, stime = 0;
  if (!(fields >> utime >> stime)) return 0;
  static const long ticks_per_second = sysconf(_SC_CLK_TCK);
  return static_cast<double>(utime + stime) / static_cast<double>(ticks_per_second > 0 ? ticks_per_second : 100);
}

// Which of this process's threads are compute threads, by thread id. A server has hundreds of
// threads (HTTP, ZeroMQ, actors) and a scheduler answers stats with this on its own thread, so
// a thread's name is read at the first two calls that see it (the second: a thread may be seen
// between its start and its naming), not at every call; a thread id gone from the listing is
// forgotten, so a reused id is read again.
class compute_thread_census {
 public:
  double seconds() {
    std::lock_guard lock(mutex_);
    std::map<std::string, verdict> seen;
    double total = 0;
    std::error_code error;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", error)) {
      const std::string tid = task.path().filename().string();
      verdict v;
      if (auto known = verdicts_.find(tid); known != verdicts_.end()) v = known->second;
      if (!v.compute && v.looks < 2) {
        v.compute = named_compute(task.path());
        ++v.looks;
      }
      seen.emplace(tid, v);
      if (v.compute) total += thread_stat_seconds(task.path());
    }
    verdicts_ = std::move(seen);
    return total;
  }

 private:
  static bool named_compute(const std::filesystem::path& task) {
    std::ifstream comm(task / "comm");
    std::string name;
    return std::getline(comm, name) && name == compute_thread_name;
  }

  struct verdict {
    bool compute = false;
    int looks = 0;  // times its name was read
  };
  std::mutex mutex_;
  std::map<std::string, verdict> verdicts_;
};

double compute_threads_seconds() {
  static compute_thread_census census;
  return census.seconds();
}

}  // namespace

int64_t thread_cpu_ns() {
  timespec t{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return 0;
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

void add_step_cpu_ns(int64_t ns) {
  if (ns > 0) step_cpu_ns.fetch_add(ns, std::memory_order_relaxed);
}

process_cpu_time current_process_cpu() {
  process_cpu_time cpu;
  cpu.total_s = clock_seconds(CLOCK_PROCESS_CPUTIME_ID);
  cpu.compute_s = static_cast<double>(step_cpu_ns.load(std::memory_order_relaxed)) * 1e-9 + compute_threads_seconds();
  return cpu;
}

std::string process_identity() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string(host) + ":" + std::to_string(getpid());
}

void mark_serving_began() {
  const process_cpu_time now = current_process_cpu();
  std::lock_guard lock(serving_began_mutex);
  if (serving_began) return;
  serving_began = true;
  cpu_when_serving_began = now;
}

process_cpu_time process_cpu_while_serving() {
  const process_cpu_time now = current_process_cpu();
  std::lock_guard lock(serving_began_mutex);
  return {now.total_s - cpu_when_serving_began.total_s, now.compute_s - cpu_when_serving_began.compute_s};
}

}  // namespace troupe
