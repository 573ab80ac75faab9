// What overlapped scheduling saves per step: the real scheduler_stage on this thread, the real
// model_runner on a worker thread (as the scheduler and worker actors run), a queue each way.
// With async_scheduling off the worker idles while the scheduler applies step N and plans N+1;
// with it on, step N+1 is already queued when step N ends. Reports steps/s and tokens/s for
// both, side by side, best of --reps.
//
//   troupe_bench_overlap --model ../shared/models/stories260K/hf [--seqs 64] [--tokens 128]
//                        [--prompt 16] [--threads 1] [--reps 3]

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "backends/cpu/blas_core.hpp"
#include "backends/cpu/cpu_model.hpp"
#include "engine/model_runner.hpp"
#include "model/loader/model_loader.hpp"
#include "stages/scheduler_stage.hpp"

namespace troupe {
namespace {

using clock_type = std::chrono::steady_clock;

// A blocking FIFO between the two threads (what an actor mailbox is to the stages).
template <class T>
class channel {
 public:
  void push(T value) {
    {
      std::lock_guard lock(mutex_);
      items_.push_back(std::move(value));
    }
    ready_.notify_one();
  }
  T pop() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return !items_.empty(); });
    T value = std::move(items_.front());
    items_.pop_front();
    return value;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<T> items_;
};

struct bench_settings {
  int num_seqs = 64;
  int num_tokens = 128;
  int prompt_len = 16;
};

struct run_figures {
  double seconds = 0;
  int num_steps = 0;
  int num_tokens = 0;
  double host_seconds = 0;  // the scheduler stage's own time (apply result, plan next)
};

run_figures run_once(model& m, const bench_settings& settings, bool async_scheduling) {
  engine_config config;
  config.block_size = m.kv_shape().block_size;
  config.num_kv_blocks = m.kv_shape().num_blocks;
  config.max_num_seqs = settings.num_seqs;
  config.max_num_batched_tokens = 4096;
  config.max_model_len = settings.prompt_len + settings.num_tokens + 8;
  config.async_scheduling = async_scheduling;
  config.enable_prefix_caching = false;  // every prompt below differs anyway
  scheduler_stage stage(config, {});

  channel<std::optional<step_plan>> plans;
  channel<step_done> results;
  std::thread worker([&] {
    model_runner runner(m, 1);
    for (;;) {
      std::optional<step_plan> plan = plans.pop();
      if (!plan) return;
      step_done done;
      done.result = runner.run(*plan);
      results.push(std::move(done));
    }
  });

  run_figures figures;
  int num_in_flight = 0;
  int num_finished = 0;
  auto deliver = [&](scheduler_stage::outputs out) {
    for (auto& plan : out.plans) {
      plans.push(std::move(plan));
      ++num_in_flight;
    }
    for (const auto& d : out.tokens.deltas) {
      figures.num_tokens += static_cast<int>(d.token_ids.size());
      if (d.finished()) ++num_finished;
    }
  };
  const auto start = clock_type::now();
  for (int i = 0; i < settings.num_seqs; ++i) {
    schedule_request r;
    r.request_id = i;
    for (int k = 0; k < settings.prompt_len; ++k) r.prompt_ids.push_back(1 + (i * 31 + k * 7) % 500);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = settings.num_tokens;
    r.sampling.ignore_eos = true;
    deliver(stage.add(std::move(r)));
  }
  while (num_in_flight > 0) {
    step_done done = results.pop();
    --num_in_flight;
    ++figures.num_steps;
    const auto host_start = clock_type::now();
    deliver(stage.step_finished(done));
    figures.host_seconds += std::chrono::duration<double>(clock_type::now() - host_start).count();
  }
  figures.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  plans.push(std::nullopt);
  worker.join();
  if (num_finished != settings.num_seqs) throw std::runtime_error("not every request finished");
  return figures;
}

}  // namespace
}  // namespace troupe

int main(int argc, char** argv) try {
  troupe::cpu::restart_with_blas_settings(argv);  // backends/cpu/blas_core.hpp
  using namespace troupe;
  std::string model_path = "../shared/models/stories260K/hf";
  bench_settings settings;
  int threads = 1, reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::runtime_error("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--model")
      model_path = value;
    else if (flag == "--seqs")
      settings.num_seqs = std::stoi(value);
    else if (flag == "--tokens")
      settings.num_tokens = std::stoi(value);
    else if (flag == "--prompt")
      settings.prompt_len = std::stoi(value);
    else if (flag == "--threads")
      threads = std::stoi(value);
    else if (flag == "--reps")
      reps = std::stoi(value);
    else
      throw std::runtime_error("unknown flag " + flag);
  }
  load_options options;
  options.path = model_path;
  options.show_progress = false;
  const loaded_model loaded = load_model(options);
  const int block_size = 16;
  const int blocks_per_seq = (settings.prompt_len + settings.num_tokens + 8 + block_size - 1) / block_size + 1;
  auto m = make_cpu_model(loaded.config, loaded.weights, kv_cache_shape{settings.num_seqs * blocks_per_seq, block_size},
                          threads);
  std::printf("model %s, %d sequences x %d tokens (prompt %d), backend %s\n", model_path.c_str(), settings.num_seqs,
              settings.num_tokens, settings.prompt_len, m->backend_name().c_str());
  run_figures best[2];
  for (int rep = 0; rep < reps; ++rep) {
    for (int async_on = 0; async_on < 2; ++async_on) {  // interleaved, so load changes hit both
      const run_figures f = run_once(*m, settings, async_on == 1);
      if (best[async_on].seconds == 0 || f.seconds < best[async_on].seconds) best[async_on] = f;
    }
  }
  for (int async_on = 0; async_on < 2; ++async_on) {
    const run_figures& f = best[async_on];
    std::printf(
        "async_scheduling %-3s: %5d steps in %.3f s = %7.1f steps/s, %8.0f tokens/s, %.1f us/step "
        "(scheduler stage %.1f us/step)\n",
        async_on ? "on" : "off", f.num_steps, f.seconds, f.num_steps / f.seconds, f.num_tokens / f.seconds,
        1e6 * f.seconds / f.num_steps, 1e6 * f.host_seconds / f.num_steps);
  }
  std::printf("on/off steps/s ratio: %.3f\n",
              (best[1].num_steps / best[1].seconds) / (best[0].num_steps / best[0].seconds));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "troupe_bench_overlap: %s\n", e.what());
  return 1;
}
