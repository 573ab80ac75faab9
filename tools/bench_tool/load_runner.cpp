#include "tools/bench_tool/load_runner.hpp"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include "tools/bench_tool/arrivals.hpp"

namespace troupe::bench_tool {

namespace {

// More threads than this would measure the bench's own scheduling rather than the server.
constexpr int max_workers = 2048;

void draw_progress(int done, int errors, int total, double seconds) {
  constexpr int width = 40;
  const int filled = total > 0 ? done * width / total : width;
  std::string bar(filled, '=');
  if (filled < width) bar += '>' + std::string(width - filled - 1, ' ');
  std::fprintf(stderr, "\r[%s] %d/%d requests, %d failed, %.1f s ", bar.c_str(), done, total, errors, seconds);
  std::fflush(stderr);
}

}  // namespace

load_result run_load(server_client& server, const std::vector<bench_request>& requests, const load_settings& settings) {
  const int n = static_cast<int>(requests.size());
  const std::vector<double> offsets = arrival_offsets(n, settings.rate, settings.burstiness, settings.seed);
  const int worker_bound = settings.concurrency > 0 ? std::min(settings.concurrency, max_workers) : max_workers;

  load_result result;
  result.records.resize(n);
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<int> ready;  // requests whose time has come, waiting for a worker
  int num_idle = 0;
  int num_starting = 0;  // spawned, still opening their session: idle as far as dispatch goes
  int num_done = 0;
  int num_errors = 0;
  bool dispatched_all = false;
  bench_clock::time_point last_reply{};
  std::vector<std::thread> workers;

  const auto start = bench_clock::now();
  auto work = [&] {
    std::unique_ptr<server_session> session;
    std::string open_error;
    try {
      session = server.open_session();
    } catch (const std::exception& e) {
      open_error = e.what();
    }
    std::unique_lock lock(mutex);
    --num_starting;
    for (;;) {
      ++num_idle;
      changed.wait(lock, [&] { return !ready.empty() || dispatched_all; });
      --num_idle;
      if (ready.empty()) return;
      const int index = ready.front();
      ready.pop_front();
      lock.unlock();
      request_record record;
      if (session) {
        record = session->send(requests[index], start);
      } else {
        record.error = "cannot open a session: " + open_error;
      }
      lock.lock();
      result.records[index] = std::move(record);
      last_reply = bench_clock::now();
      ++num_done;
      if (!result.records[index].ok) ++num_errors;
      changed.notify_all();
    }
  };

  // The dispatcher: this thread hands each request out at its time, growing the pool when
  // every worker is busy, and draws the progress bar while it waits.
  auto redraw_after = start;
  for (int i = 0; i < n; ++i) {
    const auto due =
        start + std::chrono::duration_cast<bench_clock::duration>(std::chrono::duration<double>(offsets[i]));
    std::unique_lock lock(mutex);
    while (bench_clock::now() < due) {
      changed.wait_until(lock, settings.progress ? std::min(due, redraw_after) : due);
      if (settings.progress && bench_clock::now() >= redraw_after) {
        draw_progress(num_done, num_errors, n, std::chrono::duration<double>(bench_clock::now() - start).count());
        redraw_after = bench_clock::now() + std::chrono::milliseconds(200);
      }
    }
    ready.push_back(i);
    if (num_idle + num_starting < static_cast<int>(ready.size()) && static_cast<int>(workers.size()) < worker_bound) {
      ++num_starting;
      workers.emplace_back(work);
    }
    changed.notify_all();
  }
  {
    std::unique_lock lock(mutex);
    dispatched_all = true;
    changed.notify_all();
    while (num_done < n) {
      changed.wait_for(lock, std::chrono::milliseconds(200));
      if (settings.progress) {
        draw_progress(num_done, num_errors, n, std::chrono::duration<double>(bench_clock::now() - start).count());
      }
    }
  }
  for (auto& w : workers) w.join();
  if (settings.progress) {
    draw_progress(n, num_errors, n, std::chrono::duration<double>(last_reply - start).count());
    std::fputc('\n', stderr);
  }
  result.duration = n > 0 ? std::chrono::duration<double>(last_reply - start).count() : 0.0;
  return result;
}

}  // namespace troupe::bench_tool
