// The detokenizer stage without actors, on the stories260K tokenizer and its reference greedy
// continuation of "Once upon a time": plain text, stop strings spanning tokens, the held final
// delta and the scheduler's confirmation, deltas dropped after a match, the tail released at a
// finish, the whole loop with the engine's scheduler freeing every block, and requests whose step
// failed forgotten (they have no final delta).

#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/scheduler.hpp"
#include "stages/detokenize_stage.hpp"
#include "stages/scheduler_stage.hpp"
#include "tests/shared_models.hpp"
#include "tests/stories_references.hpp"

namespace troupe {
namespace {

const std::string stories = TROUPE_SHARED_DIR "/models/stories260K/hf";

// The reference greedy continuation of "Once upon a time" on stories260K (refs.json).
const test::stories_reference& once_upon_a_time() { return test::stories_reference_for("Once upon a time"); }

class detokenize_stage_test : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories);
    tok_ = std::make_unique<tokenizer>(tokenizer::from_directory(stories));
  }

  // One token as the scheduler sends it: the request's stop strings ride on its first delta.
  static token_batch token(int64_t id, size_t index, std::vector<std::string> stop = {},
                           finish_reason finish = finish_reason::none) {
    token_delta d;
    d.request_id = id;
    d.token_ids = {once_upon_a_time().generated_ids[index]};
    d.logprobs = {token_logprobs{-0.5f * static_cast<float>(index), {}, {}}};
    if (index == 0) d.stop = std::move(stop);
    d.finish = finish;
    token_batch batch;
    if (d.finished()) {
      request_metrics m;
      m.num_output_tokens = static_cast<int>(index) + 1;
      d.metrics = m;
    }
    batch.deltas.push_back(std::move(d));
    batch.timelines.push_back(request_timeline{});
    if (finish != finish_reason::none) batch.timelines.back().num_steps = static_cast<int>(index) + 1;
    return batch;
  }

  // The scheduler's own final delta for a request it was told to stop (no tokens).
  static token_batch scheduler_final(int64_t id, finish_reason finish, int num_generated) {
    token_delta d;
    d.request_id = id;
    d.finish = finish;
    request_metrics m;
    m.num_output_tokens = num_generated;
    d.metrics = m;
    token_batch batch;
    batch.deltas.push_back(std::move(d));
    request_timeline t;
    t.num_steps = num_generated;
    batch.timelines.push_back(t);
    return batch;
  }

  std::unique_ptr<tokenizer> tok_;
};

// What reached the client for one request.
struct client_view {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<token_logprobs> logprobs;
  int num_finals = 0;
  finish_reason finish = finish_reason::none;
  std::optional<request_metrics> metrics;
  request_timeline timeline;

  void take(const text_batch& batch) {
    for (const auto& d : batch.deltas) {
      EXPECT_EQ(num_finals, 0) << "a delta after the final one";
      text += d.text;
      ids.insert(ids.end(), d.delta.token_ids.begin(), d.delta.token_ids.end());
      logprobs.insert(logprobs.end(), d.delta.logprobs.begin(), d.delta.logprobs.end());
      EXPECT_TRUE(d.delta.stop.empty()) << "stop strings are for the detokenizer only";
      if (d.delta.finished()) {
        ++num_finals;
        finish = d.delta.finish;
        metrics = d.delta.metrics;
        timeline = d.timeline;
      }
    }
  }
};

TEST_F(detokenize_stage_test, without_stop_strings_the_text_is_the_reference) {
  detokenize_stage stage(*tok_);
  client_view client;
  for (size_t i = 0; i < once_upon_a_time().generated_ids.size(); ++i) {
    const bool last = i + 1 == once_upon_a_time().generated_ids.size();
    auto out = stage.run(token(7, i, {}, last ? finish_reason::length : finish_reason::none));
    EXPECT_TRUE(out.stopped_ids.empty());
    ASSERT_EQ(out.texts.deltas.size(), 1u);
    client.take(out.texts);
  }
  EXPECT_EQ(client.text, once_upon_a_time().completion);
  EXPECT_EQ(client.ids, once_upon_a_time().generated_ids);
  EXPECT_EQ(client.finish, finish_reason::length);
  EXPECT_EQ(stage.num_live(), 0u);
}

// A served output continues its prompt: a first token with a leading space keeps it (the
// reference above starts with ",", so the continuation after "Once upon a time," is used), and a
// request that keeps special tokens has them spelled in its text.
TEST_F(detokenize_stage_test, the_output_keeps_its_first_space_and_special_tokens_when_asked) {
  detokenize_stage stage(*tok_);
  client_view plain, kept;
  for (size_t i = 1; i < 4; ++i) {  // " there was a" after ","
    token_delta d;
    d.request_id = 8;
    d.token_ids = {once_upon_a_time().generated_ids[i]};
    token_batch batch;
    batch.deltas.push_back(std::move(d));
    batch.timelines.push_back({});
    plain.take(stage.run(std::move(batch)).texts);
  }
  EXPECT_EQ(plain.text, " there was a");
  for (int32_t id : {432, 2, 383}) {  // ",", </s> (special), " there"
    token_delta d;
    d.request_id = 9;
    d.token_ids = {id};
    d.skip_special_tokens = false;  // rides on the first delta only, as stop strings do
    token_batch batch;
    batch.deltas.push_back(std::move(d));
    batch.timelines.push_back({});
    kept.take(stage.run(std::move(batch)).texts);
  }
  EXPECT_EQ(kept.text, ",</s> there");
}

TEST_F(detokenize_stage_test, a_stop_string_across_tokens_holds_the_final_until_the_scheduler_confirms) {
  detokenize_stage stage(*tok_);
  const std::string stop = "girl named Li";
  const std::string before = once_upon_a_time().completion.substr(0, once_upon_a_time().completion.find(stop));
  client_view client;
  size_t matched_at = once_upon_a_time().generated_ids.size();
  for (size_t i = 0; i < once_upon_a_time().generated_ids.size(); ++i) {
    auto out = stage.run(token(3, i, {stop, "zebra"}));
    client.take(out.texts);
    EXPECT_EQ(client.text.find("girl"), std::string::npos) << "a prefix of the stop string escaped";
    if (!out.stopped_ids.empty()) {
      EXPECT_EQ(out.stopped_ids, std::vector<int64_t>{3});
      EXPECT_TRUE(out.texts.deltas.empty()) << "the final delta waits for the scheduler";
      matched_at = i;
      break;
    }
  }
  ASSERT_LT(matched_at, once_upon_a_time().generated_ids.size()) << "the stop string never matched";
  // The scheduler sampled two more tokens before it heard: both are dropped.
  EXPECT_TRUE(stage.run(token(3, matched_at + 1)).texts.deltas.empty());
  EXPECT_TRUE(stage.run(token(3, matched_at + 2)).texts.deltas.empty());
  EXPECT_EQ(client.num_finals, 0);
  auto confirmed = stage.run(scheduler_final(3, finish_reason::stop, static_cast<int>(matched_at) + 3));
  ASSERT_EQ(confirmed.texts.deltas.size(), 1u);
  EXPECT_TRUE(confirmed.stopped_ids.empty());
  client.take(confirmed.texts);

  EXPECT_EQ(client.text, before);
  EXPECT_EQ(client.num_finals, 1);
  EXPECT_EQ(client.finish, finish_reason::stop);
  // The ids are those up to the token that completed the stop string: their text is the
  // delivered text followed by (at least) the stop string.
  const std::vector<int32_t> kept(once_upon_a_time().generated_ids.begin(),
                                  once_upon_a_time().generated_ids.begin() + matched_at + 1);
  EXPECT_EQ(client.ids, kept);
  EXPECT_EQ(tok_->decode(kept, true).substr(0, before.size() + stop.size()), before + stop);
  EXPECT_NE(tok_->decode(std::vector<int32_t>(kept.begin(), kept.end() - 1), true).find(before), std::string::npos);
  ASSERT_EQ(client.logprobs.size(), kept.size());
  EXPECT_EQ(client.logprobs.back().logprob, -0.5f * static_cast<float>(matched_at));
  ASSERT_TRUE(client.metrics);
  EXPECT_EQ(client.metrics->num_output_tokens, static_cast<int>(kept.size()));
  EXPECT_EQ(client.timeline.num_steps, static_cast<int>(matched_at) + 3);  // the scheduler's timeline
  EXPECT_EQ(stage.num_live(), 0u);
}

TEST_F(detokenize_stage_test, a_stop_string_at_the_very_start_gives_empty_text) {
  detokenize_stage stage(*tok_);
  auto out = stage.run(token(1, 0, {", there"}));
  EXPECT_TRUE(out.stopped_ids.empty());
  EXPECT_TRUE(out.texts.deltas.empty() || out.texts.deltas[0].text.empty());
  client_view client;
  client.take(out.texts);
  out = stage.run(token(1, 1));
  EXPECT_EQ(out.stopped_ids, std::vector<int64_t>{1});
  client.take(out.texts);
  client.take(stage.run(scheduler_final(1, finish_reason::stop, 2)).texts);
  EXPECT_EQ(client.text, "");
  EXPECT_EQ(client.ids,
            (std::vector<int32_t>{once_upon_a_time().generated_ids[0], once_upon_a_time().generated_ids[1]}));
  EXPECT_EQ(client.finish, finish_reason::stop);
  EXPECT_EQ(client.num_finals, 1);
}

TEST_F(detokenize_stage_test, a_match_in_the_schedulers_last_delta_ends_there_as_stop) {
  // The scheduler finished the request by length with the very token that completes the match:
  // no confirmation round, the final goes out at once with reason stop.
  detokenize_stage stage(*tok_);
  client_view client;
  const std::string stop = "Lily.";
  size_t i = 0;
  for (; i < once_upon_a_time().generated_ids.size(); ++i) {
    const std::string so_far = tok_->decode(std::vector<int32_t>(once_upon_a_time().generated_ids.begin(),
                                                                 once_upon_a_time().generated_ids.begin() + i + 1),
                                            true);
    const bool completes = so_far.find(stop) != std::string::npos;
    auto out = stage.run(token(5, i, {stop}, completes ? finish_reason::length : finish_reason::none));
    EXPECT_TRUE(out.stopped_ids.empty());
    client.take(out.texts);
    if (completes) break;
  }
  EXPECT_EQ(client.num_finals, 1);
  EXPECT_EQ(client.finish, finish_reason::stop);
  EXPECT_EQ(client.text, ", there was a little girl named ");
  EXPECT_EQ(client.ids.size(), i + 1);
  EXPECT_EQ(stage.num_live(), 0u);
}

TEST_F(detokenize_stage_test, the_schedulers_own_finish_after_a_match_still_ends_as_stop) {
  // The request hit max_tokens before the scheduler heard of the match: its final (length) is
  // the confirmation; the client sees one final, reason stop.
  detokenize_stage stage(*tok_);
  client_view client;
  size_t i = 0;
  for (; i < once_upon_a_time().generated_ids.size(); ++i) {
    auto out = stage.run(token(9, i, {"little"}));
    client.take(out.texts);
    if (!out.stopped_ids.empty()) break;
  }
  client.take(stage.run(token(9, i + 1, {}, finish_reason::length)).texts);
  EXPECT_EQ(client.num_finals, 1);
  EXPECT_EQ(client.finish, finish_reason::stop);
  EXPECT_EQ(client.text, ", there was a ");
  ASSERT_TRUE(client.metrics);
  EXPECT_EQ(client.metrics->num_output_tokens, static_cast<int>(i) + 1);
}

TEST_F(detokenize_stage_test, the_held_tail_is_released_when_the_request_ends_otherwise) {
  // "Lily!" never completes; "Lily" at the very end is held until the finish releases it.
  detokenize_stage stage(*tok_);
  client_view client;
  for (size_t i = 0; i < once_upon_a_time().generated_ids.size(); ++i) {
    const bool last = i + 1 == once_upon_a_time().generated_ids.size();
    auto out = stage.run(token(4, i, {"Lily!"}, last ? finish_reason::length : finish_reason::none));
    client.take(out.texts);
    // Before the last token, all but the "L" (or "Li") that could start "Lily!" is out.
    if (i + 2 == once_upon_a_time().generated_ids.size()) {
      EXPECT_EQ(client.text, once_upon_a_time().completion.substr(0, client.text.size()));
      EXPECT_EQ(client.text.back(), '\n') << "held back too little or too much: " << client.text;
    }
  }
  EXPECT_EQ(client.text, once_upon_a_time().completion);
  EXPECT_EQ(client.ids, once_upon_a_time().generated_ids);
  EXPECT_EQ(client.finish, finish_reason::length);
}

TEST_F(detokenize_stage_test, requests_in_one_batch_keep_their_own_stop_strings) {
  detokenize_stage stage(*tok_);
  client_view stopped, plain;
  bool confirmed = false;
  for (size_t i = 0; i < 20; ++i) {
    // After its final the scheduler sends nothing more for request 1.
    token_batch batch = token(2, i, {}, i == 19 ? finish_reason::length : finish_reason::none);
    if (!confirmed) {
      token_batch first = token(1, i, {"Lily"});
      batch.deltas.insert(batch.deltas.begin(), std::move(first.deltas[0]));
      batch.timelines.insert(batch.timelines.begin(), first.timelines[0]);
    }
    auto out = stage.run(std::move(batch));
    for (auto& d : out.texts.deltas) {
      text_batch one;
      one.deltas.push_back(d);
      (d.delta.request_id == 1 ? stopped : plain).take(one);
    }
    if (!out.stopped_ids.empty() && !confirmed) {
      // The scheduler answers at once; its final comes in the next batch, before request 1's
      // further tokens would have.
      stopped.take(stage.run(scheduler_final(1, finish_reason::stop, static_cast<int>(i) + 1)).texts);
      confirmed = true;
    }
  }
  EXPECT_EQ(stopped.text, ", there was a little girl named ");
  EXPECT_EQ(stopped.num_finals, 1);
  EXPECT_EQ(plain.text, tok_->decode(std::vector<int32_t>(once_upon_a_time().generated_ids.begin(),
                                                          once_upon_a_time().generated_ids.begin() + 20),
                                     true));
  EXPECT_EQ(plain.finish, finish_reason::length);
  EXPECT_EQ(plain.num_finals, 1);
  EXPECT_EQ(stage.num_live(), 0u);
}

// Answers each sampled row with the reference token at its output index.
step_result reference_answer(const step_plan& plan) {
  step_result result;
  result.step_id = plan.step_id;
  for (const auto& s : plan.sequences) {
    if (s.sample)
      result.tokens.push_back(
          sampled_token{s.request_id, once_upon_a_time().generated_ids[s.output_index], 0.0f, {}, {}});
  }
  return result;
}

// A pool of 32 blocks of 4 tokens: room for the reference continuation of one request.
engine_config small_engine_config() {
  engine_config config;
  config.block_size = 4;
  config.num_kv_blocks = 32;
  config.max_num_batched_tokens = 16;
  config.max_num_seqs = 2;
  config.max_model_len = 128;
  return config;
}

TEST_F(detokenize_stage_test, with_the_engine_scheduler_the_stop_frees_every_block_and_ends_once) {
  const engine_config config = small_engine_config();
  scheduler sched(config, {2});
  sampling_params params;
  params.temperature = 0.0f;
  params.max_tokens = 50;
  params.stop = {"outside in"};
  ASSERT_FALSE(sched.add_request(11, once_upon_a_time().input_ids, params));
  detokenize_stage stage(*tok_);
  client_view client;
  int steps = 0;
  while (sched.has_unfinished() && steps++ < 60) {
    step_plan plan = sched.schedule();
    token_batch batch;
    batch.deltas = sched.update(plan, reference_answer(plan));
    batch.timelines.resize(batch.deltas.size());
    auto out = stage.run(std::move(batch));
    client.take(out.texts);
    for (int64_t id : out.stopped_ids) {
      auto final_delta = sched.stop(id);
      ASSERT_TRUE(final_delta);
      EXPECT_EQ(final_delta->finish, finish_reason::stop);
      EXPECT_EQ(sched.num_free_blocks(), config.num_kv_blocks) << "blocks freed by the stop";
      token_batch confirm;
      confirm.deltas.push_back(std::move(*final_delta));
      confirm.timelines.resize(1);
      client.take(stage.run(std::move(confirm)).texts);
    }
  }
  EXPECT_FALSE(sched.has_unfinished());
  EXPECT_FALSE(sched.stop(11)) << "a finished request cannot be stopped twice";
  EXPECT_EQ(client.text, ", there was a little girl named Lily. She loved to play ");
  EXPECT_EQ(client.num_finals, 1);
  EXPECT_EQ(client.finish, finish_reason::stop);
  ASSERT_TRUE(client.metrics);
  EXPECT_EQ(client.metrics->num_output_tokens, static_cast<int>(client.ids.size()));
  EXPECT_EQ(client.metrics->num_prompt_tokens, static_cast<int>(once_upon_a_time().input_ids.size()));
  EXPECT_EQ(stage.num_live(), 0u);
}

// The scheduler and detokenizer stages wired as their actors wire them: the scheduler's token
// batches (deltas, then the requests a failed step ended) go to the detokenizer, whose texts and
// failures go to the client; its stop requests wait in `stops` until a test delivers them.
class wired_stages {
 public:
  wired_stages(const engine_config& config, const tokenizer& tok) : scheduler_(config, {2}), detokenizer_(tok) {}

  void deliver(scheduler_stage::outputs out) {
    for (auto& plan : out.plans) plans_.push_back(std::move(plan));
    for (auto& refusal : out.refusals) errors.push_back(std::move(refusal));
    if (out.tokens.empty()) return;
    auto texts = detokenizer_.run(std::move(out.tokens));
    client.take(texts.texts);
    for (auto& failure : texts.failures) errors.push_back(std::move(failure));
    stops.insert(stops.end(), texts.stopped_ids.begin(), texts.stopped_ids.end());
  }

  // The worker answers the oldest plan with the reference tokens, or fails it.
  void answer_next() {
    step_done done;
    done.result = reference_answer(take_plan());
    deliver(scheduler_.step_finished(done));
  }
  void fail_next(const std::string& why) {
    step_done done;
    done.result.step_id = take_plan().step_id;
    done.error = why;
    deliver(scheduler_.step_finished(done));
  }

  bool step_in_flight() const { return !plans_.empty(); }
  scheduler_stage& scheduler() { return scheduler_; }
  const detokenize_stage& detokenizer() const { return detokenizer_; }

  client_view client;
  std::vector<request_failed> errors;  // what the client got instead of a final delta
  std::vector<int64_t> stops;

 private:
  step_plan take_plan() {
    EXPECT_FALSE(plans_.empty()) << "no step in flight";
    step_plan plan = std::move(plans_.front());
    plans_.pop_front();
    return plan;
  }

  scheduler_stage scheduler_;
  detokenize_stage detokenizer_;
  std::deque<step_plan> plans_;
};

schedule_request wired_request(int64_t id, std::vector<std::string> stop) {
  schedule_request request;
  request.request_id = id;
  request.prompt_ids = once_upon_a_time().input_ids;
  request.sampling.temperature = 0.0f;
  request.sampling.max_tokens = 50;
  request.sampling.stop = std::move(stop);
  return request;
}

TEST_F(detokenize_stage_test, a_failed_step_ends_the_request_in_the_detokenizer_too) {
  wired_stages stages(small_engine_config(), *tok_);
  stages.deliver(stages.scheduler().add(wired_request(21, {"zebra"})));
  for (int i = 0; i < 3; ++i) stages.answer_next();
  EXPECT_EQ(stages.client.text, ", there was");
  EXPECT_EQ(stages.detokenizer().num_live(), 1u);
  stages.fail_next("device lost");
  EXPECT_EQ(stages.detokenizer().num_live(), 0u) << "the failed request's detokenizer and matcher leak";
  ASSERT_EQ(stages.errors.size(), 1u);
  EXPECT_EQ(stages.errors[0].request_id, 21);
  EXPECT_EQ(stages.errors[0].code, error_code::internal);
  EXPECT_NE(stages.errors[0].message.find("device lost"), std::string::npos);
  EXPECT_EQ(stages.client.num_finals, 0) << "the error is the request's one end";
  EXPECT_EQ(stages.scheduler().stats(0).num_free_blocks, small_engine_config().num_kv_blocks);
}

TEST_F(detokenize_stage_test, a_failed_step_after_a_stop_match_drops_the_held_final) {
  wired_stages stages(small_engine_config(), *tok_);
  stages.deliver(stages.scheduler().add(wired_request(22, {"outside in"})));
  for (int steps = 0; stages.stops.empty() && steps < 60; ++steps) stages.answer_next();
  ASSERT_EQ(stages.stops, std::vector<int64_t>{22});
  EXPECT_EQ(stages.detokenizer().num_live(), 1u) << "the final delta is held for the scheduler";
  // The step planned before the scheduler heard of the stop fails: the held final must go too.
  ASSERT_TRUE(stages.step_in_flight());
  stages.fail_next("device lost");
  EXPECT_EQ(stages.detokenizer().num_live(), 0u);
  ASSERT_EQ(stages.errors.size(), 1u);
  EXPECT_EQ(stages.errors[0].request_id, 22);
  // The stop request arrives after the failure: the scheduler no longer knows the request.
  stages.deliver(stages.scheduler().stop(22));
  EXPECT_EQ(stages.client.num_finals, 0);
  EXPECT_EQ(stages.errors.size(), 1u);
  EXPECT_EQ(stages.detokenizer().num_live(), 0u);
}

}  // namespace
}  // namespace troupe
