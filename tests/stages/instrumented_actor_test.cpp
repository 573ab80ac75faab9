// The behaviour wrapper of stages/instrumented_actor.hpp in a real actor system: every message a
// behaviour handles is counted, answers still reach who asked, mailbox depths are what waited,
// responses timed with timed_response count too, the entry goes with the actor, and a system
// without a registry runs behaviours unwrapped.

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "stages/instrumented_actor.hpp"

namespace troupe {
namespace {

using namespace std::chrono_literals;

class stats_config : public caf::actor_system_config, public actor_stats_host {
 public:
  stats_config() {
    set("scheduler.max-threads", static_cast<size_t>(2));
    set("logger.console", caf::atom("none"));
  }
};

// Doubles what it is asked; an atom-free int message keeps the test free of registrations.
caf::behavior doubler(caf::event_based_actor* self) {
  return instrumented(self, "doubler",
                      {
                          [](int x) { return 2 * x; },
                      });
}

// Blocks in its first message until `release` is set, so the messages sent meanwhile wait.
caf::behavior blocker(caf::event_based_actor* self, std::shared_future<void> release) {
  return instrumented(self, "blocker",
                      {
                          [release](int first) {
                            if (first == 0) release.wait();
                          },
                      });
}

// Asks `peer` to double x and adds one in its response handler, timed as one more message.
caf::behavior asker(caf::event_based_actor* self, caf::actor peer) {
  return instrumented(self, "asker",
                      {
                          [=](int x) -> caf::result<int> {
                            auto promise = self->make_response_promise();
                            self->request(peer, caf::infinite, x).then([=](int doubled) mutable {
                              const auto timed = timed_response(self);
                              promise.deliver(doubled + 1);
                            });
                            return promise;
                          },
                      });
}

const actor_stats_registry::entry* find_stage(const std::vector<actor_stats_registry::entry>& entries,
                                              const std::string& stage) {
  for (const auto& e : entries) {
    if (e.stage == stage) return &e;
  }
  return nullptr;
}

// The count once it reaches `n` (bounded wait): an answer leaves inside the handler, so the
// asker may read the statistics a moment before the handler's time is recorded.
int64_t count_when_at_least(const actor_stats& stats, int64_t n) {
  for (int i = 0; i < 500 && stats.snapshot(steady_now_ns()).num_messages < n; ++i) std::this_thread::sleep_for(2ms);
  return stats.snapshot(steady_now_ns()).num_messages;
}

int ask_int(caf::actor_system& system, const caf::actor& whom, int x) {
  caf::scoped_actor self(system);
  int answer = -1;
  self->request(whom, 5s, x).receive([&](int value) { answer = value; }, [](caf::error&) {});
  return answer;
}

TEST(instrumented_actor, counts_every_message_and_answers_still_arrive) {
  stats_config config;
  caf::actor_system system(config);
  auto actor = system.spawn(doubler);
  for (int i = 0; i < 25; ++i) ASSERT_EQ(ask_int(system, actor, i), 2 * i);
  actor_stats_registry* registry = stats_registry_of(system);
  ASSERT_NE(registry, nullptr);
  const auto entries = registry->entries();
  const auto* entry = find_stage(entries, "doubler");
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->id, actor.id());
  EXPECT_EQ(count_when_at_least(*entry->stats, 25), 25);
  const actor_stats_snapshot snap = entry->stats->snapshot(steady_now_ns());
  EXPECT_GT(snap.handler_p50_us, 0);
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}

TEST(instrumented_actor, samples_the_messages_waiting_behind_each_one) {
  stats_config config;
  caf::actor_system system(config);
  std::promise<void> release;
  // Released whatever happens below: a blocked detached actor would hang the system's end.
  auto releaser = std::unique_ptr<std::promise<void>, void (*)(std::promise<void>*)>(
      &release, [](std::promise<void>* p) { p->set_value(); });
  auto actor = system.spawn<caf::detached>(blocker, release.get_future().share());
  caf::anon_send(actor, 0);
  // The first message is in its handler (blocked) or about to be; these four wait behind it.
  for (int i = 1; i <= 4; ++i) caf::anon_send(actor, i);
  actor_stats_registry* registry = stats_registry_of(system);
  // A detached actor makes its behaviour on its own thread: bounded wait for its entry.
  std::shared_ptr<actor_stats> stats;
  for (int i = 0; i < 500 && !(stats = registry->find(actor.id())); ++i) std::this_thread::sleep_for(10ms);
  releaser.reset();
  ASSERT_NE(stats, nullptr);
  // Bounded: the five messages take microseconds once released.
  for (int i = 0; i < 500 && stats->snapshot(steady_now_ns()).num_messages < 5; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  const actor_stats_snapshot snap = stats->snapshot(steady_now_ns());
  EXPECT_EQ(snap.num_messages, 5);
  // The second message saw the last three behind it (the first may have seen up to all four).
  EXPECT_GE(snap.max_mailbox_depth, 3);
  EXPECT_LE(snap.max_mailbox_depth, 4);
  EXPECT_EQ(snap.mailbox_depth, 0);  // the last left nothing behind
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}

TEST(instrumented_actor, a_timed_response_counts_as_a_message) {
  stats_config config;
  caf::actor_system system(config);
  auto peer = system.spawn(doubler);
  auto actor = system.spawn(asker, peer);
  EXPECT_EQ(ask_int(system, actor, 20), 41);
  EXPECT_EQ(ask_int(system, actor, 1), 3);
  std::shared_ptr<actor_stats> stats = stats_registry_of(system)->find(actor.id());
  ASSERT_NE(stats, nullptr);
  EXPECT_EQ(count_when_at_least(*stats, 4), 4);  // two asks, two responses
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(peer, caf::exit_reason::user_shutdown);
}

TEST(instrumented_actor, the_entry_goes_with_the_actor) {
  stats_config config;
  caf::actor_system system(config);
  auto actor = system.spawn(doubler);
  ASSERT_EQ(ask_int(system, actor, 1), 2);
  actor_stats_registry* registry = stats_registry_of(system);
  ASSERT_NE(registry->find(actor.id()), nullptr);
  const caf::actor_id id = actor.id();
  {
    caf::scoped_actor self(system);
    self->monitor(actor);
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    self->receive([](caf::down_msg&) {}, caf::after(5s) >> [] {});
  }
  actor = nullptr;
  // The exit's functors run as the actor ends, which the down message follows.
  for (int i = 0; i < 500 && registry->find(id); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(registry->find(id), nullptr);
}

TEST(instrumented_actor, a_system_without_a_registry_runs_the_behaviour_as_it_is) {
  caf::actor_system_config config;
  config.set("logger.console", caf::atom("none"));
  caf::actor_system system(config);
  EXPECT_EQ(stats_registry_of(system), nullptr);
  auto actor = system.spawn(doubler);
  EXPECT_EQ(ask_int(system, actor, 21), 42);
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe
