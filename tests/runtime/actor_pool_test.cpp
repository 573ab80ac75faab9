// The node's actor pool (runtime/actor_pool.hpp): CAF's scheduler running on the
// wake-after-unlock work-sharing policy must deliver every message, whether the pool is busy or
// every thread has gone to sleep (a lost wake-up would leave a message queued for ever), and
// must shut down with work still queued.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scheduler/coordinator.hpp>
#include <caf/send.hpp>

#include "runtime/actor_pool.hpp"

namespace troupe {
namespace {

class pool_config : public caf::actor_system_config {
 public:
  explicit pool_config(size_t num_threads) {
    use_wake_after_unlock_pool(*this);
    set("scheduler.max-threads", num_threads);
    set("logger.console", caf::atom("none"));
  }
};

// Counts what it is sent and fulfils the promise at `expected`.
caf::behavior counter(caf::event_based_actor*, int expected, std::shared_ptr<std::atomic<int>> count,
                      std::shared_ptr<std::promise<void>> done) {
  return {[=](int) {
    if (count->fetch_add(1) + 1 == expected) done->set_value();
  }};
}

// Hands each number on to the next actor of the ring until it reaches zero, then counts it.
caf::behavior relay(caf::event_based_actor* self, std::shared_ptr<caf::actor> next,
                    std::shared_ptr<std::atomic<int>> arrived) {
  return {[=](int hops) {
    if (hops > 0) self->send(*next, hops - 1);
    else arrived->fetch_add(1);
  }};
}

TEST(actor_pool, runs_on_the_wake_after_unlock_policy) {
  pool_config cfg(2);
  caf::actor_system system(cfg);
  EXPECT_NE(dynamic_cast<caf::scheduler::coordinator<wake_after_unlock_sharing>*>(&system.scheduler()), nullptr);
}

TEST(actor_pool, a_message_to_a_sleeping_pool_is_always_delivered) {
  pool_config cfg(2);
  caf::actor_system system(cfg);
  constexpr int num_messages = 200;
  auto count = std::make_shared<std::atomic<int>>(0);
  auto done = std::make_shared<std::promise<void>>();
  auto finished = done->get_future();
  auto actor = system.spawn(counter, num_messages, count, done);
  for (int i = 0; i < num_messages; ++i) {
    const int before = count->load();
    caf::anon_send(actor, i);
    // Wait for this one before the next, so that every send finds the pool threads asleep or
    // about to sleep: the moments a lost wake-up would show.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (count->load() == before) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "message " << i << " was never delivered";
      if (i % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  }
  ASSERT_EQ(finished.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}

TEST(actor_pool, many_senders_and_a_ring_of_actors_lose_nothing) {
  pool_config cfg(3);
  caf::actor_system system(cfg);
  constexpr int num_senders = 4, per_sender = 5000;
  auto count = std::make_shared<std::atomic<int>>(0);
  auto done = std::make_shared<std::promise<void>>();
  auto finished = done->get_future();
  auto sink = system.spawn(counter, num_senders * per_sender, count, done);
  std::vector<std::thread> senders;
  for (int t = 0; t < num_senders; ++t) {
    senders.emplace_back([&] {
      for (int i = 0; i < per_sender; ++i) caf::anon_send(sink, i);
    });
  }
  // Meanwhile the pool passes messages among its own actors (the internal enqueue path).
  constexpr int ring_size = 8, hops = 2000;
  auto arrived = std::make_shared<std::atomic<int>>(0);
  std::vector<std::shared_ptr<caf::actor>> next(ring_size);
  for (auto& n : next) n = std::make_shared<caf::actor>();
  std::vector<caf::actor> ring;
  for (int i = 0; i < ring_size; ++i) ring.push_back(system.spawn(relay, next[i], arrived));
  for (int i = 0; i < ring_size; ++i) *next[i] = ring[(i + 1) % ring_size];
  for (const auto& member : ring) caf::anon_send(member, hops);
  for (auto& s : senders) s.join();
  ASSERT_EQ(finished.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(count->load(), num_senders * per_sender);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (arrived->load() < ring_size && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(arrived->load(), ring_size) << "a message travelling the ring was lost";
  // Leave work queued for the shutdown: the system's destructor stops the pool with it.
  for (const auto& member : ring) caf::anon_send(member, hops);
  for (auto& member : ring) caf::anon_send_exit(member, caf::exit_reason::user_shutdown);
  for (auto& n : next) *n = caf::actor{};  // the ring's references to one another
  caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe
