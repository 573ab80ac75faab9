#include "planner/cluster_simulation.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <unordered_map>

#include "engine/scheduler.hpp"
#include "stages/engine_router.hpp"

namespace troupe {

std::string simulated_cluster::name() const {
  std::string topology = num_prefill + num_decode > 0
                             ? std::to_string(num_prefill) + "P" + std::to_string(num_decode) + "D"
                             : "colocated x" + std::to_string(num_mixed);
  if (num_prefill + num_decode > 0 && num_mixed > 0) topology += " + " + std::to_string(num_mixed) + " mixed";
  return topology + ", budget " + std::to_string(config.max_num_batched_tokens);
}

const step_cost& step_costs_by_role::of(engine_role role) const {
  if (role == engine_role::prefill && prefill) return *prefill;
  if (role == engine_role::decode && decode) return *decode;
  return mixed;
}

void simulated_cluster::validate() const {
  if (num_mixed < 0 || num_prefill < 0 || num_decode < 0 || num_mixed + num_prefill + num_decode == 0) {
    throw std::invalid_argument("a simulated cluster needs at least one instance and no negative counts");
  }
  if ((num_prefill > 0) != (num_decode > 0)) {
    throw std::invalid_argument("a disaggregated cluster needs prefill and decode instances both, got " +
                                std::to_string(num_prefill) + "P" + std::to_string(num_decode) + "D");
  }
  if (!(kv_latency_s >= 0) || !(kv_seconds_per_token >= 0)) {
    throw std::invalid_argument("KV transfer costs must be zero or positive");
  }
  if (host.cores < 0 || host.threads_per_instance < 1 || host.stack_threads < 1) {
    throw std::invalid_argument(
        "shared cores: the cores must be 0 (not shared) or more, and an instance's and the stack's threads 1 or "
        "more");
  }
  for (double cost : {host.stack_seconds_per_request, host.stack_seconds_per_token, host.client_seconds_per_request}) {
    if (!(cost >= 0) || !std::isfinite(cost)) {
      throw std::invalid_argument("shared cores: the stack's and the clients' CPU costs must be finite, 0 or more");
    }
  }
  // A fitted coefficient may be negative (least squares over features that move together); the
  // model's prediction is never below zero whatever they are.
  for (engine_role role : {engine_role::mixed, engine_role::prefill, engine_role::decode}) {
    const step_cost& cost = step_times.of(role);
    for (double c : cost.seconds) {
      if (!std::isfinite(c)) throw std::invalid_argument("step-time coefficients must be finite numbers");
    }
    if (!(cost.token_floor >= 1)) throw std::invalid_argument("the step-time model's token floor must be at least 1");
    if (!(cost.min_seconds >= 0) || !std::isfinite(cost.min_seconds)) {
      throw std::invalid_argument(
          "the step-time model's least step time must be a finite number of seconds, 0 or more");
    }
  }
  config.validate();
}

double simulation_result::attainment(const service_level& slo) const {
  if (requests.empty()) return 0;
  const auto met =
      std::count_if(requests.begin(), requests.end(), [&](const simulated_outcome& r) { return r.meets(slo); });
  return static_cast<double>(met) / static_cast<double>(requests.size());
}

namespace {

// The token every simulated step samples: any id below the smallest vocabulary, and never an
// end (requests ignore EOS and stop at their output length).
constexpr int32_t sampled_token_id = 7;

struct simulated_instance {
  engine_instance_id id = 0;
  const step_cost* step_times = nullptr;  // its role's
  std::unique_ptr<scheduler> sched;
  // Planned steps, the running one first: with async scheduling the next is planned when one
  // starts, as the scheduler stage does (at most two out), else one at a time.
  std::deque<step_outline> in_flight;
  double remaining_s = 0;  // the first of in_flight's work left, in seconds at full speed
  double started_s = 0;    // when the first of in_flight began
};

// Work of the serving stack, done in order: a request's arrival (dispatched when done) or a
// batch of tokens on their way to the client (delivered when done).
struct stack_job {
  double remaining_s = 0;
  std::optional<size_t> arrival;
  token_batch tokens;
};

struct kv_transfer_end {
  double at_s = 0;
  engine_instance_id decode = 0;
  int64_t request_id = 0;
  uint64_t transfer_id = 0;
};

class cluster_run {
 public:
  cluster_run(const simulated_cluster& cluster, const std::vector<planned_request>& workload)
      : cluster_(cluster), workload_(workload), router_(cluster.config.block_size) {
    if (cluster.host.shared() && workload.size() > 1) {
      const double span = workload.back().arrival_s - workload.front().arrival_s;
      const double rate = span > 0 ? static_cast<double>(workload.size() - 1) / span : 0;
      client_load_ = std::min(static_cast<double>(cluster.host.cores), rate * cluster.host.client_seconds_per_request);
    }
    result_.requests.resize(workload.size());
    for (size_t i = 0; i < workload.size(); ++i) result_.requests[i].arrival_s = workload[i].arrival_s;
    auto add = [&](engine_role role, int count) {
      for (int i = 0; i < count; ++i) {
        auto instance = std::make_unique<simulated_instance>();
        instance->id = router_.add_instance("simulated", role);
        instance->step_times = &cluster.step_times.of(role);
        instance->sched = std::make_unique<scheduler>(cluster.config, std::vector<int32_t>{});
        instance->sched->set_clock([this] { return at(now_s_); });
        router_.set_load(instance->id, load_of(*instance));
        instances_.emplace(instance->id, std::move(instance));
      }
    };
    add(engine_role::mixed, cluster.num_mixed);
    add(engine_role::prefill, cluster.num_prefill);
    add(engine_role::decode, cluster.num_decode);
  }

  simulation_result run(double horizon_s) {
    const double last_arrival = workload_.empty() ? 0 : workload_.back().arrival_s;
    size_t next_arrival = 0;
    // Bounded: every step ends a planned step of a live request, and time stops at the horizon.
    while (true) {
      const speeds speed = speeds_now();
      double next = std::numeric_limits<double>::infinity();
      if (next_arrival < workload_.size()) next = workload_[next_arrival].arrival_s;
      for (const auto& [id, instance] : instances_) {
        if (!instance->in_flight.empty()) {
          next = std::min(next, now_s_ + instance->remaining_s / instance_speed(speed));
        }
      }
      for_each_running_stack_job(
          [&](stack_job& job) { next = std::min(next, now_s_ + job.remaining_s / speed.thread); });
      for (const kv_transfer_end& t : transfers_) next = std::min(next, t.at_s);
      if (next == std::numeric_limits<double>::infinity() || next > last_arrival + horizon_s) break;
      work_for(next - now_s_, speed);
      now_s_ = next;
      finish_steps();
      finish_stack_jobs();
      land_transfers();
      while (next_arrival < workload_.size() && workload_[next_arrival].arrival_s <= now_s_) {
        arrive(next_arrival++);
      }
      start_steps();
    }
    for (simulated_outcome& r : result_.requests) {
      if (r.error.empty() && r.finish_s < 0) {
        r.error = "not finished " + std::to_string(static_cast<int>(horizon_s)) + " s after the last arrival";
      }
      if (r.finish_s > result_.end_s) result_.end_s = r.finish_s;
    }
    return std::move(result_);
  }

 private:
  // Work (seconds at full speed) done by each runner between two events.
  static constexpr double done_within = 1e-12;

  // What share of its speed each runner gets on the shared cores: 1 unless more threads want them
  // than there are cores. `thread`: a one-thread runner (a stack job, the step of an instance that
  // keeps one thread busy), in processor sharing. `step`: the step of an instance whose step keeps
  // several threads busy. Those threads meet after every op, so the step goes at the pace of the
  // one that shares its core with the most others, 1 / ceil(runnable threads / cores) of its
  // speed, not cores / wanted: a 2-thread decode beside one busy thread on two cores ran 2.1x
  // slower where sharing says 1.5x (docs/benchmarks.md, "Tried on the CPU and left out"). The
  // clients' fractional load adds one more thread that share of the time. What such a step leaves
  // of its cores while its threads wait for each other goes to the one-thread runners.
  struct speeds {
    double thread = 1;
    double step = 1;
  };
  speeds speeds_now() {
    if (!cluster_.host.shared()) return {};
    const int per_instance = cluster_.host.threads_per_instance;
    int stack_threads = 0, instance_threads = 0, stepping = 0;
    for_each_running_stack_job([&](const stack_job&) { ++stack_threads; });
    for (const auto& [id, instance] : instances_) {
      if (instance->in_flight.empty()) continue;
      instance_threads += per_instance;
      ++stepping;
    }
    const double cores = cluster_.host.cores;
    const double wanted = client_load_ + stack_threads + instance_threads;
    speeds now;
    now.thread = wanted > cores ? cores / wanted : 1.0;
    if (per_instance == 1 || stepping == 0) {
      now.step = now.thread;
      return now;
    }
    const int runnable = stack_threads + instance_threads;
    const double whole = std::floor(client_load_), part = client_load_ - whole;
    auto pace = [&](double threads) { return threads > cores ? 1.0 / std::ceil(threads / cores) : 1.0; };
    now.step = std::min(now.thread, (1 - part) * pace(runnable + whole) + part * pace(runnable + whole + 1));
    const double single_wanted = client_load_ + stack_threads;
    const double left = cores - static_cast<double>(instance_threads) * now.step;
    now.thread = single_wanted > 0 ? std::min(1.0, left / single_wanted) : 1.0;
    return now;
  }
  // An instance's step: every instance keeps threads_per_instance busy.
  double instance_speed(const speeds& now) const {
    return cluster_.host.threads_per_instance > 1 ? now.step : now.thread;
  }

  // `seconds` of wall time at the given speeds.
  void work_for(double seconds, const speeds& now) {
    for (auto& [id, instance] : instances_) {
      if (!instance->in_flight.empty()) instance->remaining_s -= seconds * instance_speed(now);
    }
    for_each_running_stack_job([&](stack_job& job) { job.remaining_s -= seconds * now.thread; });
  }

  // The stack's jobs in progress: the first stack_threads of its queue with work left (one done
  // behind a running one holds no thread while it waits to retire).
  template <class F>
  void for_each_running_stack_job(F&& f) {
    int running = 0;
    for (stack_job& job : stack_) {
      if (running == cluster_.host.stack_threads) break;
      if (job.remaining_s <= done_within) continue;
      f(job);
      ++running;
    }
  }

  static engine_clock::time_point at(double seconds) {
    return engine_clock::time_point{} +
           std::chrono::duration_cast<engine_clock::duration>(std::chrono::duration<double>(seconds));
  }

  static engine_load load_of(const simulated_instance& instance) {
    const scheduler& s = *instance.sched;
    return engine_load{s.num_free_blocks(), s.kv_cache().num_blocks(), s.num_running(), s.num_waiting(),
                       s.step_times().seconds_per_prompt_token()};
  }

  schedule_request request_for(size_t index) {
    const planned_request& planned = workload_[index];
    schedule_request request;
    request.request_id = static_cast<int64_t>(index);
    // Random ids: no two prompts share a block, so the prefix cache finds nothing, as with
    // tools/bench's random prompts.
    std::uniform_int_distribution<int32_t> token(3, 499);
    request.prompt_ids.resize(static_cast<size_t>(planned.prompt_len));
    for (int32_t& id : request.prompt_ids) id = token(rng_);
    request.sampling.temperature = 0;
    request.sampling.max_tokens = planned.output_len;
    request.sampling.ignore_eos = true;
    request.targets.ttft_ms = cluster_.targets.ttft_s * 1e3;
    request.targets.tpot_ms = cluster_.targets.tpot_s * 1e3;
    return request;
  }

  // Through the stack first when it has a cost, else straight to the router.
  void arrive(size_t index) {
    if (cluster_.host.shared() && cluster_.host.stack_seconds_per_request > 0) {
      stack_.push_back(stack_job{cluster_.host.stack_seconds_per_request, index, {}});
      return;
    }
    dispatch(request_for(index));
  }

  // Tokens reach the client after the stack's work on them, in order behind what it has.
  void send_to_client(token_batch batch) {
    if (!cluster_.host.shared() || (stack_.empty() && cluster_.host.stack_seconds_per_token <= 0)) {
      deliver(batch);
      return;
    }
    size_t num_tokens = 0;
    for (const token_delta& delta : batch.deltas) num_tokens += delta.token_ids.size();
    stack_.push_back(stack_job{cluster_.host.stack_seconds_per_token * static_cast<double>(num_tokens), std::nullopt,
                               std::move(batch)});
  }

  // In order: a job done behind one still running waits for it (tokens reach a client in order).
  void finish_stack_jobs() {
    while (!stack_.empty() && stack_.front().remaining_s <= done_within) {
      stack_job job = std::move(stack_.front());
      stack_.pop_front();
      if (job.arrival) {
        dispatch(request_for(*job.arrival));
      } else {
        deliver(job.tokens);
      }
    }
  }

  // Routes a new or re-run request and hands it (or its two halves) to the schedulers.
  void dispatch(schedule_request request) {
    const int64_t id = request.request_id;
    const std::optional<engine_router::routed> routed = router_.route(request);
    if (!routed) {
      fail(id, "no engine instance takes requests");
      return;
    }
    if (!routed->decode) {
      admit(routed->instance, request, kv_handoff{}, arrival_of(id));
      return;
    }
    if (!admit(*routed->decode, request, kv_handoff{kv_role::receive, routed->transfer_id, "simulated"},
               arrival_of(id))) {
      return;
    }
    if (!admit(routed->instance, request, kv_handoff{kv_role::send, routed->transfer_id, {}}, arrival_of(id))) {
      if (auto* decode = find(*routed->decode)) decode->sched->abort(id);
      return;
    }
    // The decode half's reservation: the router learns its receiver is ready (the prefill half's
    // sender may then send), as the KV agent's answer tells it when serving.
    for (const kv_reservation& r : find(*routed->decode)->sched->take_kv_reservations()) {
      router_.on_kv_ready(*routed->decode, kv_ready_msg{r.request_id, r.transfer_id, {}, {}, {}, {}});
    }
  }

  engine_clock::time_point arrival_of(int64_t id) const { return at(workload_[static_cast<size_t>(id)].arrival_s); }

  bool admit(engine_instance_id instance_id, const schedule_request& request, kv_handoff kv,
             engine_clock::time_point arrival) {
    simulated_instance* instance = find(instance_id);
    if (!instance) {
      fail(request.request_id, "the router chose an unknown instance");
      return false;
    }
    if (auto error =
            instance->sched->add_request(request.request_id, request.prompt_ids, request.sampling, request.priority,
                                         arrival, request.resumed_output_ids, std::move(kv), request.targets)) {
      router_.on_refusal(instance_id, request_failed{request.request_id, error_code::overloaded, error->message});
      apply_commands();
      fail(request.request_id, "refused: " + error->message);
      return false;
    }
    return true;
  }

  simulated_instance* find(engine_instance_id id) {
    auto it = instances_.find(id);
    return it == instances_.end() ? nullptr : it->second.get();
  }

  void fail(int64_t id, std::string why) {
    simulated_outcome& outcome = result_.requests[static_cast<size_t>(id)];
    if (outcome.error.empty() && outcome.finish_s < 0) outcome.error = std::move(why);
  }

  void start_steps() {
    const size_t max_in_flight = cluster_.config.async_scheduling ? 2 : 1;
    for (auto& [id, instance] : instances_) {
      while (instance->in_flight.size() < max_in_flight && instance->sched->has_unfinished()) {
        const step_plan plan = instance->sched->schedule();
        if (plan.empty()) break;
        instance->in_flight.push_back(outline_of(plan));
        if (instance->in_flight.size() == 1) {
          instance->remaining_s = instance->step_times->predict(shape_of(instance->in_flight.front()));
          instance->started_s = now_s_;
        }
        ++result_.num_steps;
      }
    }
  }

  void finish_steps() {
    for (auto& [id, instance] : instances_) {
      if (instance->in_flight.empty() || instance->remaining_s > done_within) continue;
      const step_outline step = std::move(instance->in_flight.front());
      instance->in_flight.pop_front();
      const double took_s = now_s_ - instance->started_s;  // its prediction, or longer on shared cores
      // The worker takes up the plan already out at once.
      if (!instance->in_flight.empty()) {
        instance->remaining_s = instance->step_times->predict(shape_of(instance->in_flight.front()));
        instance->started_s = now_s_;
      }
      // The scheduler's own model learns the step's time as it would from the worker's report,
      // so the slo policy predicts with what it would have fitted online.
      instance->sched->observe_step(step, took_s);
      step_result result;
      result.step_id = step.step_id;
      for (const planned_sequence& s : step.sequences) {
        if (s.sample) result.tokens.push_back(sampled_token{s.request_id, sampled_token_id});
      }
      token_batch batch;
      batch.deltas = instance->sched->update(step, result);
      batch.timelines.resize(batch.deltas.size());
      batch.load = load_of(*instance);
      send_to_client(router_.on_tokens(id, std::move(batch)));
      apply_commands();
    }
  }

  // What reaches the client: first token and end times, as tools/bench measures them.
  void deliver(const token_batch& batch) {
    for (const token_delta& delta : batch.deltas) {
      simulated_outcome& outcome = result_.requests[static_cast<size_t>(delta.request_id)];
      if (!delta.token_ids.empty()) {
        if (outcome.first_token_s < 0) {
          outcome.first_token_s = now_s_;
        } else {
          const double gap = (now_s_ - outcome.last_token_s) / static_cast<double>(delta.token_ids.size());
          outcome.token_gaps_s.insert(outcome.token_gaps_s.end(), delta.token_ids.size(), gap);
        }
        outcome.last_token_s = now_s_;
      }
      outcome.output_tokens += static_cast<int>(delta.token_ids.size());
      if (delta.finished()) outcome.finish_s = now_s_;
    }
  }

  void apply_commands() {
    router_commands commands = router_.take_commands();
    for (const auto& [instance_id, request_id] : commands.aborts) {
      if (simulated_instance* instance = find(instance_id)) instance->sched->abort(request_id);
    }
    for (const auto& [decode_id, handover] : commands.handovers) {
      simulated_instance* decode = find(decode_id);
      if (!decode) continue;
      decode->sched->hand_over(handover.request_id, handover.transfer_id, handover.token_ids);
      // The KV streamed out layer by layer while the prompt was computed; what is left when
      // the prefill ends is the transfer's latency and its share per token.
      const planned_request& planned = workload_[static_cast<size_t>(handover.request_id)];
      transfers_.push_back(
          kv_transfer_end{now_s_ + cluster_.kv_latency_s + cluster_.kv_seconds_per_token * planned.prompt_len,
                          decode_id, handover.request_id, handover.transfer_id});
    }
    for (schedule_request& rerun : commands.reruns) dispatch(std::move(rerun));
    for (const request_failed& failure : commands.failures) fail(failure.request_id, failure.message);
  }

  void land_transfers() {
    auto done = std::stable_partition(transfers_.begin(), transfers_.end(),
                                      [&](const kv_transfer_end& t) { return t.at_s > now_s_; });
    for (auto it = done; it != transfers_.end(); ++it) {
      if (simulated_instance* decode = find(it->decode)) {
        decode->sched->kv_arrived(it->request_id, it->transfer_id);
        router_.on_kv_landed(it->decode, kv_arrival_msg{it->request_id, it->transfer_id, true, {}});
      }
    }
    transfers_.erase(done, transfers_.end());
  }

  const simulated_cluster& cluster_;
  const std::vector<planned_request>& workload_;
  engine_router router_;
  std::map<engine_instance_id, std::unique_ptr<simulated_instance>> instances_;  // ordered: deterministic
  std::vector<kv_transfer_end> transfers_;
  std::deque<stack_job> stack_;
  double client_load_ = 0;  // cores the clients keep busy, on shared cores
  simulation_result result_;
  std::mt19937_64 rng_{0x7e0c};
  double now_s_ = 0;
};

}  // namespace

simulation_result simulate(const simulated_cluster& cluster, const std::vector<planned_request>& workload,
                           double horizon_s) {
  cluster.validate();
  if (!std::is_sorted(workload.begin(), workload.end(),
                      [](const planned_request& a, const planned_request& b) { return a.arrival_s < b.arrival_s; })) {
    throw std::invalid_argument("a simulated workload must be in arrival order");
  }
  return cluster_run(cluster, workload).run(horizon_s);
}

}  // namespace troupe
