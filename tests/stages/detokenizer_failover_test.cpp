// A detokenizer lost mid-stream and its replacement, without actors: the router's ledger notes
// every batch it sends, the lost stage ran some of them (their text reached the client) and died
// with the rest in its mailbox; the new stage is resumed from the ledger and what the client has.
// Whatever the moment of the loss, the client gets the reference text and ids once, one final,
// with a stop string's held prefix neither lost nor repeated. Also the ledger's own bounds.

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "plugins/plugin_chain.hpp"
#include "stages/detokenize_stage.hpp"
#include "stages/detokenizer_ledger.hpp"
#include "tests/shared_models.hpp"
#include "tests/stories_references.hpp"

namespace troupe {
namespace {

const std::string stories = TROUPE_SHARED_DIR "/models/stories260K/hf";

// The reference greedy continuation of "Once upon a time" on stories260K (refs.json).
const test::stories_reference& once_upon_a_time() { return test::stories_reference_for("Once upon a time"); }

// The scheduler's deltas for one request: two tokens each (the last one finishes it by length).
std::vector<token_batch> scheduler_batches(int64_t id, std::vector<std::string> stop) {
  std::vector<token_batch> batches;
  for (size_t i = 0; i < once_upon_a_time().generated_ids.size(); i += 2) {
    token_delta d;
    d.request_id = id;
    d.token_ids.assign(once_upon_a_time().generated_ids.begin() + static_cast<std::ptrdiff_t>(i),
                       once_upon_a_time().generated_ids.begin() +
                           static_cast<std::ptrdiff_t>(std::min(i + 2, once_upon_a_time().generated_ids.size())));
    for (size_t k = 0; k < d.token_ids.size(); ++k) d.logprobs.push_back({-0.25f * static_cast<float>(i + k), {}, {}});
    if (i == 0) d.stop = stop;
    if (i + 2 >= once_upon_a_time().generated_ids.size()) {
      d.finish = finish_reason::length;
      d.metrics = request_metrics{};
      d.metrics->num_output_tokens = static_cast<int>(once_upon_a_time().generated_ids.size());
    }
    token_batch batch;
    batch.deltas.push_back(std::move(d));
    batch.timelines.push_back(request_timeline{});
    batches.push_back(std::move(batch));
  }
  return batches;
}

struct client_view {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<token_logprobs> logprobs;
  int num_finals = 0;
  int32_t num_tokens() const { return num_finals > 0 ? -1 : static_cast<int32_t>(ids.size()); }
  void take(const text_batch& batch) {
    for (const text_delta& d : batch.deltas) {
      EXPECT_EQ(num_finals, 0) << "a delta after the final one";
      text += d.text;
      ids.insert(ids.end(), d.delta.token_ids.begin(), d.delta.token_ids.end());
      logprobs.insert(logprobs.end(), d.delta.logprobs.begin(), d.delta.logprobs.end());
      if (d.delta.finished()) ++num_finals;
    }
  }
};

class detokenizer_failover_test : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories);
    tok_ = std::make_unique<tokenizer>(tokenizer::from_directory(stories));
  }

  // The lost stage spells the first `num_run` batches; the next `num_in_mailbox` die with it;
  // then the new one is resumed and gets the rest, as the router sends them.
  // Each stage gets its own plugins from `plugins` (as on two nodes), when given.
  client_view lose_and_resume(size_t num_run, size_t num_in_mailbox, const std::vector<std::string>& stop,
                              const std::function<std::shared_ptr<plugin_chain>()>& plugins = {}) {
    const std::vector<token_batch> batches = scheduler_batches(7, stop);
    detokenizer_ledger ledger;
    client_view client;
    size_t next = 0;
    {
      detokenize_stage lost(*tok_, plugins ? plugins() : nullptr);
      for (; next < num_run && next < batches.size(); ++next) {
        ledger.record(batches[next], 0);
        client.take(lost.run(batches[next]).texts);
      }
    }
    for (size_t i = 0; i < num_in_mailbox && next < batches.size(); ++i, ++next) ledger.record(batches[next], 0);
    if (next > 0) {
      EXPECT_EQ(ledger.requests_of(0, 1), std::vector<int64_t>{7});
    }
    detokenize_stage replacement(*tok_, plugins ? plugins() : nullptr);
    detokenizer_ledger::resumption resumed = ledger.resume({{7, client.num_tokens()}});
    for (const detokenizer_resume_msg& prime : resumed.primes) replacement.resume(prime);
    if (!resumed.replay.empty()) client.take(replacement.run(resumed.replay).texts);
    for (; next < batches.size(); ++next) {
      ledger.record(batches[next], 0);
      client.take(replacement.run(batches[next]).texts);
    }
    EXPECT_EQ(replacement.num_live(), 0u);
    return client;
  }

  std::unique_ptr<tokenizer> tok_;
};

TEST_F(detokenizer_failover_test, at_any_moment_of_the_loss_the_client_gets_every_token_once) {
  const size_t num_batches = (once_upon_a_time().generated_ids.size() + 1) / 2;
  for (size_t num_run = 0; num_run <= num_batches; ++num_run) {
    for (size_t num_in_mailbox = 0; num_in_mailbox <= 3; ++num_in_mailbox) {
      SCOPED_TRACE("lost after " + std::to_string(num_run) + " batches, " + std::to_string(num_in_mailbox) +
                   " in its mailbox");
      const client_view client = lose_and_resume(num_run, num_in_mailbox, {"zebra"});
      EXPECT_EQ(client.text, once_upon_a_time().completion);
      EXPECT_EQ(client.ids, once_upon_a_time().generated_ids);
      ASSERT_EQ(client.logprobs.size(), once_upon_a_time().generated_ids.size());
      for (size_t i = 0; i < once_upon_a_time().generated_ids.size(); ++i)
        EXPECT_EQ(client.logprobs[i].logprob, -0.25f * static_cast<float>(i));
      EXPECT_EQ(client.num_finals, 1);
      if (HasFailure()) return;
    }
  }
}

TEST_F(detokenizer_failover_test, a_held_prefix_of_a_stop_string_is_neither_lost_nor_repeated) {
  // "girl named L" is held back while it may become the stop string, then released as text.
  const size_t num_batches = (once_upon_a_time().generated_ids.size() + 1) / 2;
  for (size_t num_run = 0; num_run <= num_batches; ++num_run) {
    SCOPED_TRACE("lost after " + std::to_string(num_run) + " batches");
    const client_view client = lose_and_resume(num_run, 1, {"girl named Lx"});
    EXPECT_EQ(client.text, once_upon_a_time().completion);
    EXPECT_EQ(client.num_finals, 1);
    if (HasFailure()) return;
  }
}

// An output plugin's state for the request moves with it: the PII redactor
// (examples/plugins/pii_redactor.c) holds back a text that may start the word it hides, and a
// loss at that moment must not drop the held part ("named ly") nor let the word through whole.
TEST_F(detokenizer_failover_test, an_output_plugins_held_text_is_neither_lost_nor_leaked) {
  const std::string library = std::string(TROUPE_BINARY_DIR) + "/plugins/libtroupe_pii_redactor.so";
  plugin_spec redactor;
  redactor.library = library;
  // A hold bound below the text's length: a replay in one call would pass it and release all.
  redactor.config_json = R"({"word": "Lily", "max_hold_bytes": 32})";
  auto plugins = [&] { return std::make_shared<plugin_chain>(std::vector<plugin_spec>{redactor}, "output"); };
  std::string expected = once_upon_a_time().completion;
  ASSERT_NE(expected.find("Lily"), std::string::npos);
  for (size_t at; (at = expected.find("Lily")) != std::string::npos;) expected.replace(at, 4, "[redacted]");
  const size_t num_batches = (once_upon_a_time().generated_ids.size() + 1) / 2;
  for (size_t num_run = 0; num_run <= num_batches; ++num_run) {
    for (size_t num_in_mailbox = 0; num_in_mailbox <= 2; ++num_in_mailbox) {
      SCOPED_TRACE("lost after " + std::to_string(num_run) + " batches, " + std::to_string(num_in_mailbox) +
                   " in its mailbox");
      const client_view client = lose_and_resume(num_run, num_in_mailbox, {}, plugins);
      EXPECT_EQ(client.text, expected);
      EXPECT_EQ(client.ids, once_upon_a_time().generated_ids);
      EXPECT_EQ(client.num_finals, 1);
      if (HasFailure()) return;
    }
  }
}

TEST_F(detokenizer_failover_test, a_stop_string_still_ends_the_text_after_the_loss) {
  const std::string stop = "She wanted";
  for (size_t num_run : {size_t(2), size_t(10), size_t(20)}) {
    SCOPED_TRACE("lost after " + std::to_string(num_run) + " batches");
    const std::vector<token_batch> batches = scheduler_batches(9, {stop});
    detokenizer_ledger ledger;
    client_view client;
    {
      detokenize_stage lost(*tok_);
      for (size_t i = 0; i < num_run; ++i) {
        ledger.record(batches[i], 0);
        client.take(lost.run(batches[i]).texts);
      }
    }
    detokenize_stage replacement(*tok_);
    detokenizer_ledger::resumption resumed = ledger.resume({{9, client.num_tokens()}});
    for (const detokenizer_resume_msg& prime : resumed.primes) replacement.resume(prime);
    if (!resumed.replay.empty()) client.take(replacement.run(resumed.replay).texts);
    bool stopped = false;
    for (size_t i = num_run; i < batches.size() && !stopped; ++i) {
      auto out = replacement.run(batches[i]);
      client.take(out.texts);
      stopped = !out.stopped_ids.empty();
    }
    ASSERT_TRUE(stopped) << "the stop string never matched after the loss";
    token_delta final_delta;
    final_delta.request_id = 9;
    final_delta.finish = finish_reason::stop;
    token_batch confirm;
    confirm.deltas.push_back(final_delta);
    confirm.timelines.push_back({});
    client.take(replacement.run(confirm).texts);
    EXPECT_EQ(client.text, once_upon_a_time().completion.substr(0, once_upon_a_time().completion.find(stop)));
    EXPECT_EQ(client.num_finals, 1);
  }
}

TEST_F(detokenizer_failover_test, nothing_is_sent_again_for_a_client_that_had_its_end) {
  detokenizer_ledger ledger;
  for (const token_batch& batch : scheduler_batches(5, {})) ledger.record(batch, 0);
  const detokenizer_ledger::resumption resumed = ledger.resume({{5, -1}, {6, 0}});
  EXPECT_TRUE(resumed.primes.empty());
  EXPECT_TRUE(resumed.replay.empty());
}

TEST_F(detokenizer_failover_test, a_failure_that_died_with_the_detokenizer_is_sent_again) {
  detokenizer_ledger ledger;
  std::vector<token_batch> batches = scheduler_batches(5, {});
  ledger.record(batches[0], 0);
  token_batch failed;
  failed.failures.push_back(request_failed{5, error_code::internal, "the step failed"});
  ledger.record(failed, 0);
  const detokenizer_ledger::resumption resumed = ledger.resume({{5, 2}});
  ASSERT_EQ(resumed.primes.size(), 1u);
  EXPECT_EQ(resumed.primes[0].spelled_ids, std::vector<int32_t>(once_upon_a_time().generated_ids.begin(),
                                                                once_upon_a_time().generated_ids.begin() + 2));
  EXPECT_TRUE(resumed.replay.deltas.empty());
  ASSERT_EQ(resumed.replay.failures.size(), 1u);
  EXPECT_EQ(resumed.replay.failures[0].message, "the step failed");
}

TEST_F(detokenizer_failover_test, the_ledger_forgets_ended_requests_after_a_while_and_beyond_its_bound) {
  using std::chrono::seconds;
  detokenizer_ledger ledger(seconds(10), 2);
  const timestamp_ns second = 1'000'000'000;
  for (int64_t id = 1; id <= 3; ++id) {
    for (const token_batch& batch : scheduler_batches(id, {})) ledger.record(batch, id * second);
  }
  EXPECT_EQ(ledger.size(), 2u) << "beyond max_ended, the oldest ended request goes";
  std::vector<token_batch> running = scheduler_batches(4, {});
  ledger.record(running[0], 30 * second);
  EXPECT_EQ(ledger.size(), 1u) << "ended requests are kept for keep_ended only; a running one stays";
  EXPECT_EQ(ledger.requests_of(0, 1), std::vector<int64_t>{4});
}

}  // namespace
}  // namespace troupe
