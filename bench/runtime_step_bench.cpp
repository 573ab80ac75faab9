// The runtime's own cost per step, with the model's time taken out. The real stage actors run
// in a CAF system set up like a node's (scheduler, detached worker with its model_runner,
// detokenizer); a sink stands in for the frontend's ZeroMQ door. N requests are added at once
// and decode together; the model is wrapped so that every forward records when it began and
// ended (wall clock) and the CPU time it used on its thread. Over the steps where all N
// sequences decode one token each:
//
//   gap     = begin(step k+1) - end(step k): the critical path between two forwards (sampling,
//             step_done to the scheduler, update, schedule, step_plan to the worker, batch build);
//   cpu     = process CPU time over the window - the forwards' own CPU time, per step: all the
//             runtime's work, detokenization included, wherever it ran;
//   forward = the model's time, reported for scale.
//
// The default model is stories260K (real weights and tokenizer, vocabulary 512) so that the
// forward is short and the runtime's share stands out; sampling is counted as the runtime's.
//
// --forward null takes the model's time out altogether: the forward writes logits whose argmax
// is a fixed token and computes nothing, so the steps follow each other as fast as the runtime
// plans, runs, samples and applies them, and `step` is the runtime's own cost per step. With a
// real forward the threads the runtime hands work to have slept through it, and on a VM waking
// a halted vCPU costs its waker 15-50 us (docs/benchmarks.md): `gap` then includes that cost.
//
//   troupe_bench_runtime [--model HF_DIR] [--seqs 1,16,64] [--steps 200] [--reps 3] [--async on|off]
//                        [--forward real|null] [--policy sharing|stealing] [--penalties on|off]
//
// With --async on (two steps in flight) the scheduler's work leaves the critical path, so the
// gap shrinks to the worker's own hand-offs while the CPU figure stays the runtime's whole cost.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "backends/cpu/blas_core.hpp"
#include "bench/bench_support.hpp"
#include "engine/served_model.hpp"
#include "node/topology.hpp"
#include "stages/detokenize_stage.hpp"
#include "stages/error_category.hpp"
#include "stages/message_inspect.hpp"
#include "stages/stage_actors.hpp"

namespace {

using troupe::timestamp_ns;

timestamp_ns wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

timestamp_ns cpu_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<timestamp_ns>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct forward_record {
  timestamp_ns begin = 0;
  timestamp_ns end = 0;
  timestamp_ns process_cpu_at_begin = 0;
  timestamp_ns thread_cpu = 0;  // CPU time of the forward on the worker's thread
  int num_tokens = 0;
  int num_sequences = 0;
};

// The served model, timed. Runs on the worker's thread only; read after the run is over.
class timed_model : public troupe::model {
 public:
  // null_forward: the forward computes nothing and writes logits whose argmax is a fixed token,
  // so the steps follow each other as fast as the runtime can plan, run and apply them.
  timed_model(std::unique_ptr<troupe::model> inner, bool null_forward)
      : inner_(std::move(inner)), null_forward_(null_forward) {
    records_.reserve(1 << 16);
  }

  const troupe::model_config& config() const override { return inner_->config(); }
  troupe::kv_cache_shape kv_shape() const override { return inner_->kv_shape(); }
  std::string backend_name() const override { return inner_->backend_name(); }

  void forward(const troupe::forward_batch& batch, float* logits) override {
    timed(batch, [&] {
      if (!null_forward_) return inner_->forward(batch, logits);
      const size_t vocab = static_cast<size_t>(config().vocab_size);
      for (size_t row = 0; row < static_cast<size_t>(batch.num_logits()); ++row) {
        std::fill_n(logits + row * vocab, vocab, 0.0f);
        logits[row * vocab + 3 + row % (vocab - 3)] = 1.0f;
      }
    });
  }
  // A backend that samples on its device does so inside the timed call (counted as the model's).
  bool can_sample_on_device() const override { return !null_forward_ && inner_->can_sample_on_device(); }
  void forward_sample(const troupe::forward_batch& batch, std::span<const troupe::device_sampling_row> rows,
                      int32_t* tokens) override {
    timed(batch, [&] { inner_->forward_sample(batch, rows, tokens); });
  }

  std::vector<forward_record> take_records() { return std::exchange(records_, {}); }

 private:
  template <class Run>
  void timed(const troupe::forward_batch& batch, Run run) {
    forward_record r;
    r.process_cpu_at_begin = cpu_ns(CLOCK_PROCESS_CPUTIME_ID);
    const timestamp_ns thread_begin = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
    r.begin = wall_ns();
    run();
    r.end = wall_ns();
    r.thread_cpu = cpu_ns(CLOCK_THREAD_CPUTIME_ID) - thread_begin;
    r.num_tokens = static_cast<int>(batch.token_ids.size());
    r.num_sequences = static_cast<int>(batch.context_lengths.size());
    records_.push_back(r);
  }

  std::unique_ptr<troupe::model> inner_;
  bool null_forward_;
  std::vector<forward_record> records_;
};

// Set up like the node's actor system (node/node.cpp): `sharing` policy, a small pool.
// `--policy stealing` swaps in CAF's work-stealing pool, whose idle threads poll before they
// sleep: it shows how much of the gap is the wake-up of a sleeping pool thread.
class bench_config : public caf::actor_system_config {
 public:
  bench_config(int num_threads, const std::string& policy) {
    set("scheduler.policy", caf::atom_from_string(policy));
    set("scheduler.max-threads", static_cast<size_t>(num_threads));
    set("logger.console", caf::atom("none"));
    troupe::register_error_category(*this);
  }
};

struct run_outcome {
  int num_finished = 0;
  int num_tokens = 0;
  std::string error;
};

// Stands in for the frontend: counts the text it is handed and says when all requests ended.
caf::behavior sink_actor(caf::event_based_actor* self, int num_requests,
                         std::shared_ptr<std::promise<run_outcome>> done) {
  auto outcome = std::make_shared<run_outcome>();
  auto finish_one = [=] {
    if (++outcome->num_finished == num_requests) done->set_value(*outcome);
  };
  return {
      [=](troupe::text_batch& batch) {
        for (const auto& d : batch.deltas) {
          outcome->num_tokens += static_cast<int>(d.delta.token_ids.size());
          if (d.delta.finished()) finish_one();
        }
      },
      [=](troupe::request_failed& failed) {
        if (outcome->error.empty()) outcome->error = failed.message;
        finish_one();
      },
      [=](troupe::stats_answer&) {},
  };
}

struct step_figures {
  int num_steps = 0;
  double wall_us = 0;     // per step
  double forward_us = 0;  // per step
  double gap_mean_us = 0;
  double gap_median_us = 0;
  double cpu_us = 0;  // runtime CPU per step
};

// Figures over the longest run of consecutive forwards in which all `num_seqs` decode; nothing
// when there were fewer than 3 such steps (the requests joined over many steps: this thread was
// descheduled while it sent them, as happens on a loaded machine).
std::optional<step_figures> figures_of(const std::vector<forward_record>& records, int num_seqs) {
  size_t best_begin = 0, best_len = 0;
  for (size_t i = 0; i < records.size();) {
    size_t j = i;
    while (j < records.size() && records[j].num_sequences == num_seqs && records[j].num_tokens == num_seqs) ++j;
    if (j - i > best_len) {
      best_begin = i;
      best_len = j - i;
    }
    i = std::max(j, i + 1);
  }
  if (best_len < 3) return std::nullopt;
  const size_t first = best_begin, last = best_begin + best_len - 1;
  step_figures f;
  f.num_steps = static_cast<int>(last - first);  // steps k = first..last-1, each begin(k)..begin(k+1)
  std::vector<double> gaps;
  double forward_ns = 0, forward_cpu_ns = 0;
  for (size_t k = first; k < last; ++k) {
    forward_ns += static_cast<double>(records[k].end - records[k].begin);
    forward_cpu_ns += static_cast<double>(records[k].thread_cpu);
    gaps.push_back(static_cast<double>(records[k + 1].begin - records[k].end));
  }
  const double n = f.num_steps;
  f.wall_us = static_cast<double>(records[last].begin - records[first].begin) / n / 1e3;
  f.forward_us = forward_ns / n / 1e3;
  f.gap_mean_us = std::accumulate(gaps.begin(), gaps.end(), 0.0) / n / 1e3;
  std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
  f.gap_median_us = gaps[gaps.size() / 2] / 1e3;
  const double process_cpu =
      static_cast<double>(records[last].process_cpu_at_begin - records[first].process_cpu_at_begin);
  f.cpu_us = (process_cpu - forward_cpu_ns) / n / 1e3;
  return f;
}

using troupe::bench::load_average;
using troupe::bench::parse_list;

}  // namespace

int main(int argc, char** argv) try {
  troupe::cpu::restart_with_blas_settings(argv);  // backends/cpu/blas_core.hpp
  std::string model_path = TROUPE_SHARED_DIR "/models/stories260K/hf";
  std::vector<int> seq_counts = {1, 16, 64};
  int steps = 200, reps = 3, prompt_len = 8;
  bool async_scheduling = true;  // as a node runs by default
  std::string policy = "sharing";
  bool null_forward = false;
  bool penalties = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::runtime_error("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--model")
      model_path = value;
    else if (flag == "--seqs")
      seq_counts = parse_list(value);
    else if (flag == "--steps")
      steps = std::stoi(value);
    else if (flag == "--reps")
      reps = std::stoi(value);
    else if (flag == "--prompt")
      prompt_len = std::stoi(value);
    else if (flag == "--forward" && (value == "real" || value == "null"))
      null_forward = value == "null";
    else if (flag == "--async" && (value == "on" || value == "off"))
      async_scheduling = value == "on";
    else if (flag == "--policy" && (value == "sharing" || value == "stealing"))
      policy = value;
    else if (flag == "--penalties" && (value == "on" || value == "off"))
      penalties = value == "on";
    else
      throw std::runtime_error("unknown flag or value: " + flag + " " + value +
                               " (expected --model DIR, --seqs N,N, --steps N, --reps N, --prompt N, --forward "
                               "real|null, --async on|off, --policy sharing|stealing)");
  }
  if (steps < 4 || reps < 1 || prompt_len < 1) throw std::runtime_error("--steps >= 4, --reps >= 1, --prompt >= 1");
  const int max_seqs = *std::max_element(seq_counts.begin(), seq_counts.end());

  troupe::model_spec spec;
  spec.path = model_path;
  spec.backend.threads = 1;  // the forward stays on the worker's thread, so its thread CPU time is all of it
  spec.max_num_seqs = max_seqs;
  spec.num_kv_blocks = max_seqs * ((prompt_len + steps + 2 + spec.block_size - 1) / spec.block_size + 1);
  auto served = troupe::load_served_model(spec);
  auto timed = std::make_unique<timed_model>(std::move(served->backend_model), null_forward);
  timed_model* timing = timed.get();
  served->backend_model = std::move(timed);
  const int vocab = served->loaded.config.vocab_size;

  troupe::engine_config config = served->base_engine_config();
  config.max_num_batched_tokens = std::max(2048, max_seqs * prompt_len);
  config.max_num_seqs = max_seqs;
  config.async_scheduling = async_scheduling;
  config.validate();

  std::printf(
      "model %s (vocab %d), %s forward, %d decode steps per run, best of %d, async scheduling %s, %s pool, "
      "load average %.2f\n",
      model_path.c_str(), vocab, null_forward ? "null" : "real", steps, reps, async_scheduling ? "on" : "off",
      policy.c_str(), load_average());
  std::printf("%6s %8s %11s %11s %10s %12s %10s\n", "seqs", "steps", "step (us)", "model (us)", "gap (us)",
              "gap med (us)", "cpu (us)");
  bench_config cfg(3, policy);  // as a node with its default two tokenizers
  caf::actor_system system(cfg);
  auto worker = system.spawn<caf::detached>(troupe::worker_actor, served, troupe::worker_kv_settings{},
                                            troupe::worker_drafts{}, std::shared_ptr<troupe::plugin_chain>{});
  troupe::kv_agent_handle kv_agent;  // the scheduler needs its worker's KV agent (unused: no disaggregation here)
  {
    caf::scoped_actor asker(system);
    asker->request(worker, caf::infinite, troupe::describe_atom::value)
        .receive([&](troupe::worker_description& d) { kv_agent = d.kv_agent; },
                 [](caf::error&) { std::fprintf(stderr, "the worker did not describe itself\n"); });
  }
  int64_t next_id = 1;
  for (int num_seqs : seq_counts) {
    std::vector<step_figures> runs;
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
      auto done = std::make_shared<std::promise<run_outcome>>();
      auto finished = done->get_future();
      auto sink = system.spawn(sink_actor, num_seqs, done);
      // The sink stands in for the doors' actor: it takes the text batches and refusals the
      // detokenizer sends (the only messages it sends there).
      auto detokenizer =
          system.spawn(troupe::detokenizer_actor, std::make_shared<troupe::detokenize_stage>(*served->tok),
                       caf::actor_cast<troupe::frontend_handle>(sink));
      // No router: one instance, token batches straight to the detokenizer, which stands in for
      // the router (nothing is refused here and there is no KV plane, so token batches are all the
      // scheduler sends it).
      auto scheduler = system.spawn(troupe::scheduler_actor, config, std::vector<int32_t>{}, worker,
                                    caf::actor_cast<troupe::router_handle>(detokenizer), kv_agent,
                                    std::chrono::milliseconds(10000), std::chrono::milliseconds(30000));
      timing->take_records();
      for (int s = 0; s < num_seqs; ++s) {
        troupe::schedule_request r;
        r.request_id = next_id++;
        for (int i = 0; i < prompt_len; ++i) r.prompt_ids.push_back(3 + (s * 31 + i * 7) % (vocab - 3));
        r.sampling.temperature = 0.0f;
        r.sampling.max_tokens = steps + 1;
        r.sampling.ignore_eos = true;
        if (penalties) {  // sampled on the host, against each request's whole history
          r.sampling.repetition_penalty = 1.1f;
          r.sampling.frequency_penalty = 0.1f;
        }
        caf::anon_send(scheduler, std::move(r));
      }
      const run_outcome outcome = finished.get();
      if (!outcome.error.empty()) throw std::runtime_error("a request failed: " + outcome.error);
      if (outcome.num_tokens != num_seqs * (steps + 1)) {
        throw std::runtime_error("expected " + std::to_string(num_seqs * (steps + 1)) + " tokens, got " +
                                 std::to_string(outcome.num_tokens));
      }
      // The worker's last forward happened before the last token reached the sink.
      auto records = timing->take_records();
      for (auto& a : {sink, caf::actor_cast<caf::actor>(detokenizer), caf::actor_cast<caf::actor>(scheduler)}) {
        caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
      }
      if (rep == 0) continue;
      if (auto figures = figures_of(records, num_seqs)) {
        runs.push_back(*figures);
      } else {
        std::fprintf(stderr, "seqs %d round %d: fewer than 3 steps with every sequence decoding; round left out\n",
                     num_seqs, rep);
      }
    }
    if (runs.empty()) {
      throw std::runtime_error("no round had 3 steps with all " + std::to_string(num_seqs) +
                               " sequences decoding; raise --steps or --reps");
    }
    auto by_cpu = [](const step_figures& a, const step_figures& b) { return a.cpu_us < b.cpu_us; };
    auto by_gap = [](const step_figures& a, const step_figures& b) { return a.gap_median_us < b.gap_median_us; };
    const step_figures best_cpu = *std::min_element(runs.begin(), runs.end(), by_cpu);
    const step_figures best_gap = *std::min_element(runs.begin(), runs.end(), by_gap);
    std::printf("%6d %8d %11.1f %11.1f %10.1f %12.1f %10.1f\n", num_seqs, best_gap.num_steps, best_gap.wall_us,
                best_gap.forward_us, best_gap.gap_mean_us, best_gap.gap_median_us, best_cpu.cpu_us);
    std::fflush(stdout);
  }
  caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
  std::printf("load average %.2f after the runs\n", load_average());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "troupe_bench_runtime: %s\n", e.what());
  return 1;
}
