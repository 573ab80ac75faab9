// One error convention: the code a refused request reaches the client with (request_failed, then
// the wire) is the scheduler's own, for every kind of refusal; no mapping sits between them.

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/scheduler.hpp"
#include "stages/scheduler_stage.hpp"

namespace troupe::test {
namespace {

constexpr int32_t eos = 2;

schedule_request request(int64_t id, int num_prompt_tokens, double ttft_ms = 0) {
  schedule_request r;
  r.request_id = id;
  for (int i = 0; i < num_prompt_tokens; ++i) r.prompt_ids.push_back(3 + i % 50);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 2;
  r.targets.ttft_ms = ttft_ms;
  return r;
}

struct refusal_case {
  std::string name;
  engine_config config;
  std::vector<schedule_request> requests;  // the last one is refused
  error_code expected;
};

engine_config base_config() {
  engine_config c;
  c.block_size = 16;
  c.num_kv_blocks = 4096;
  c.max_num_batched_tokens = 256;
  c.max_num_seqs = 4;
  c.max_model_len = 4096;
  c.enable_prefix_caching = false;
  return c;
}

std::vector<refusal_case> refusal_cases() {
  std::vector<refusal_case> cases;
  cases.push_back({"an empty prompt", base_config(), {request(1, 0)}, error_code::bad_request});
  engine_config small = base_config();
  small.max_model_len = 32;
  cases.push_back({"a prompt that fills the context", small, {request(1, 32)}, error_code::bad_request});
  cases.push_back({"a live id", base_config(), {request(1, 5), request(1, 5)}, error_code::duplicate_id});
  engine_config one_waiting = base_config();
  one_waiting.max_waiting_requests = 1;
  cases.push_back(
      {"a full waiting queue", one_waiting, {request(1, 5), request(2, 5), request(3, 5)}, error_code::overloaded});
  // 20 prompts of 2000 tokens queued: a 200 ms TTFT target cannot be met behind them.
  engine_config slo = base_config();
  slo.scheduling_policy = scheduling_policy_kind::slo;
  slo.slo_admission = slo_admission_mode::reject;
  std::vector<schedule_request> queue;
  for (int i = 1; i <= 20; ++i) queue.push_back(request(i, 2000));
  queue.push_back(request(100, 10, /*ttft_ms=*/200));
  cases.push_back({"an unattainable TTFT target", slo, queue, error_code::slo_unattainable});
  return cases;
}

// The scheduler stage plans as soon as a request arrives, so the plain scheduler beside it plans
// once after the first request too: both hold the same queue when the last request comes.
TEST(scheduler_refusal_code, a_refused_requests_wire_code_is_the_schedulers_for_each_kind) {
  for (const refusal_case& c : refusal_cases()) {
    SCOPED_TRACE(c.name);
    scheduler plain(c.config, {eos});
    std::optional<request_error> refused;
    for (size_t i = 0; i < c.requests.size(); ++i) {
      const schedule_request& r = c.requests[i];
      refused = plain.add_request(r.request_id, r.prompt_ids, r.sampling, r.priority, engine_clock::now(),
                                  r.resumed_output_ids, r.kv, r.targets);
      if (i + 1 < c.requests.size()) {
        ASSERT_FALSE(refused) << refused->message;
      }
      if (i == 0) plain.schedule();
    }
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->code, c.expected) << refused->message;

    scheduler_stage stage(c.config, {eos});
    std::vector<request_failed> refusals;
    for (const schedule_request& r : c.requests) refusals = stage.add(r).refusals;
    ASSERT_EQ(refusals.size(), 1u);
    EXPECT_EQ(refusals[0].request_id, c.requests.back().request_id);
    EXPECT_EQ(refusals[0].code, refused->code);
    // The slo refusal ends with its predicted time, which counts the milliseconds since arrival.
    auto fixed_part = [](const std::string& message) { return message.substr(0, message.find(", about")); };
    EXPECT_EQ(fixed_part(refusals[0].message), fixed_part(refused->message));
  }
}

}  // namespace
}  // namespace troupe::test
