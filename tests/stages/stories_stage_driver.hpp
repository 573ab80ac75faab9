#pragma once
// One scheduler stage and one model runner over the trained stories260K model, without actors:
// the stage's plans go to the runner in order and its answers come back, as the engine's two
// actors would pass them. What each request streamed is collected per id. A test may answer a
// plan itself instead of the runner (answer_next), to stand for a worker that failed.

#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/cpu_model.hpp"
#include "engine/model_runner.hpp"
#include "model/loader/model_loader.hpp"
#include "stages/scheduler_stage.hpp"
#include "tests/shared_models.hpp"

namespace troupe::test {

struct stage_request_outcome {
  std::vector<int32_t> tokens;
  std::vector<std::vector<std::string>> stops;  // each delta's stop strings
  std::vector<uint32_t> attempts;               // each delta's run of the request
  finish_reason finish = finish_reason::none;
  std::optional<request_metrics> metrics;
  std::vector<request_failed> failures;
};

struct stories_stage_options {
  bool async_scheduling = false;  // one step in flight, or two
  int num_blocks = 48;
  int block_size = 4;
  int max_num_batched_tokens = 16;  // a prompt takes several steps
  std::chrono::milliseconds pipeline_failover_wait = std::chrono::milliseconds(30000);
  bool failures_expected = false;  // false: a failed request fails the test where it happens
};

class stories_stage_driver {
 public:
  explicit stories_stage_driver(stories_stage_options options)
      : options_(options),
        loaded_(load_model(load_options{stories260k_dir / "hf", load_format::auto_detect, dtype::f32, 0, false})),
        model_(
            make_cpu_model(loaded_.config, loaded_.weights, kv_cache_shape{options.num_blocks, options.block_size}, 1)),
        runner_(*model_, 1),
        stage_(config(options, loaded_.config.vocab_size), {2}, options.pipeline_failover_wait) {}

  // What the stage refused at once (straight to the frontend in the engine).
  [[nodiscard]] std::vector<request_failed> add(schedule_request request) {
    scheduler_stage::outputs out = stage_.add(std::move(request));
    std::vector<request_failed> refusals = std::move(out.refusals);
    out.refusals.clear();
    take(std::move(out));
    return refusals;
  }

  // The next plan is answered by `answer` instead of the runner (it fills in step_done).
  void answer_next(std::function<void(const step_plan&, step_done&)> answer) { answers_.push_back(std::move(answer)); }

  // Runs plans until none is left (bounded).
  void run(int max_steps = 500) {
    for (int steps = 0; !plans_.empty() && steps < max_steps; ++steps) step();
    EXPECT_TRUE(plans_.empty()) << "the stage still had plans after " << max_steps << " steps";
  }
  void step() {
    step_plan plan = std::move(plans_.front());
    plans_.pop_front();
    step_done done;
    done.compute_ns = 1;
    if (!answers_.empty()) {
      answers_.front()(plan, done);
      answers_.pop_front();
    } else {
      done.result = runner_.run(plan);
    }
    take(stage_.step_finished(done));
  }
  void tick(timestamp_ns now) { take(stage_.tick(now)); }

  size_t num_plans() const { return plans_.size(); }
  const scheduler_stage& stage() const { return stage_; }

  std::map<int64_t, stage_request_outcome> outcomes;
  std::vector<int64_t> preempted_ids_seen;  // what the plans told the worker to forget

 private:
  static engine_config config(const stories_stage_options& options, int vocab_size) {
    engine_config c;
    c.block_size = options.block_size;
    c.num_kv_blocks = options.num_blocks;
    c.max_num_batched_tokens = options.max_num_batched_tokens;
    c.max_num_seqs = 8;
    c.max_model_len = 128;
    c.vocab_size = vocab_size;
    c.async_scheduling = options.async_scheduling;
    return c;
  }

  void take(scheduler_stage::outputs out) {
    EXPECT_TRUE(out.refusals.empty()) << out.refusals.front().message;
    if (!options_.failures_expected) {
      EXPECT_TRUE(out.tokens.failures.empty()) << out.tokens.failures.front().message;
    }
    for (auto& plan : out.plans) {
      preempted_ids_seen.insert(preempted_ids_seen.end(), plan.preempted_ids.begin(), plan.preempted_ids.end());
      plans_.push_back(std::move(plan));
    }
    for (const request_failed& f : out.tokens.failures) outcomes[f.request_id].failures.push_back(f);
    for (const token_delta& d : out.tokens.deltas) {
      stage_request_outcome& o = outcomes[d.request_id];
      EXPECT_EQ(o.finish, finish_reason::none) << "request " << d.request_id << " got a delta after its final";
      o.tokens.insert(o.tokens.end(), d.token_ids.begin(), d.token_ids.end());
      o.stops.push_back(d.stop);
      o.attempts.push_back(d.attempt);
      if (d.finished()) {
        o.finish = d.finish;
        o.metrics = d.metrics;
      }
    }
  }

  stories_stage_options options_;
  loaded_model loaded_;
  std::unique_ptr<model> model_;
  model_runner runner_;
  scheduler_stage stage_;
  std::deque<step_plan> plans_;
  std::deque<std::function<void(const step_plan&, step_done&)>> answers_;
};

}  // namespace troupe::test
