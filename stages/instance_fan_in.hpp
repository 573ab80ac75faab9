#pragma once
// A query the router asks every engine instance and answers once, for all of them: the instances'
// answers (or failures) are folded in as they come, in any order, and the last one settles the
// reply. Plain classes, so the sums and the clock arithmetic are tested without actors; the
// router actor only sends the requests and delivers `reply()` when `settled()`.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "stages/messages.hpp"
#include "stages/stage_clock.hpp"
#include "stages/trace_messages.hpp"

namespace troupe {

// stats_query: the instances' free/total blocks, running, waiting and KV counts summed.
class stats_fan_in {
 public:
  stats_fan_in(uint64_t tag, int num_instances);

  void add(const stats_answer& answer);
  void fail(std::string error);  // an instance that did not answer (timeout, gone)
  bool settled() const { return num_pending_ == 0; }
  // The total; `unavailable` names the last error when no instance answered, or what each one
  // said when every instance that answered said it cannot serve (a pipeline stage down).
  stats_answer reply();

 private:
  stats_answer sum_;
  int num_pending_;
  int num_answered_ = 0;
  int num_serving_ = 0;  // answers without `unavailable`
  std::string last_error_;
  std::string down_;  // the answers' `unavailable`, joined
};

// trace_query: every instance's steps, each given the instance's id, with its start moved onto
// the router's clock. An instance measures a step's start as an age before its own answer; the
// router takes that answer to have left at the midpoint of the round trip it measured (the
// instance's clock may be another host's: no stamp of it is used), and the reply carries ages
// again, before the router's own answer.
class trace_fan_in {
 public:
  trace_fan_in(uint64_t tag, int num_instances);

  // `sent` and `received`: the router's clock when it asked this instance and got its answer.
  void add(int32_t instance, std::string node, trace_answer answer, timestamp_ns sent, timestamp_ns received);
  void fail(std::string error);
  bool settled() const { return num_pending_ == 0; }
  trace_answer reply(timestamp_ns now);

 private:
  trace_answer all_;
  std::vector<std::pair<timestamp_ns, step_event>> steps_;  // the router's stamp of each step's start
  int num_pending_;
  std::string last_error_;
};

}  // namespace troupe
