#pragma once
// The thread pool that runs a node's (non-detached) stage actors: CAF's work-sharing pool with
// one change, made for the hand-off that sits on every step's critical path (the worker's
// step_done to the scheduler).
//
// CAF 0.17's `sharing` policy signals its condition variable while it still holds the queue's
// lock. The pool thread it wakes then blocks at once on that lock, so the waker pays a second
// futex wake on unlock: two wake-ups per message to an idle pool. On a VM each wake-up of a
// halted vCPU goes through the hypervisor and costs the waker 15-25 us (measured on the build
// machine, docs/benchmarks.md), so the worker lost ~45 us per step. This policy pushes under the
// lock and signals after releasing it, and only when a thread is asleep: one wake-up at most.
// Everything else (one central queue, FIFO, blocking dequeue) is CAF's sharing policy.

#include <condition_variable>
#include <cstddef>
#include <list>
#include <mutex>

#include <caf/actor_system_config.hpp>
#include <caf/policy/unprofiled.hpp>
#include <caf/resumable.hpp>
#include <caf/scheduler/coordinator.hpp>

namespace troupe {

class wake_after_unlock_sharing : public caf::policy::unprofiled {
 public:
  using queue_type = std::list<caf::resumable*>;

  struct coordinator_data {
    explicit coordinator_data(caf::scheduler::abstract_coordinator*) {}
    queue_type queue;
    std::mutex lock;
    std::condition_variable cv;
    size_t num_sleeping = 0;  // pool threads waiting on `cv`, guarded by `lock`
  };

  struct worker_data {
    explicit worker_data(caf::scheduler::abstract_coordinator*) {}
  };

  template <class Coordinator>
  void enqueue(Coordinator* self, caf::resumable* job) {
    queue_type node;
    node.push_back(job);  // allocate outside the lock
    auto& data = d(self);
    bool wake = false;
    {
      std::lock_guard<std::mutex> guard(data.lock);
      data.queue.splice(data.queue.end(), node);
      wake = data.num_sleeping > 0;
    }
    if (wake) data.cv.notify_one();
  }

  template <class Coordinator>
  void central_enqueue(Coordinator* self, caf::resumable* job) {
    enqueue(self, job);
  }

  template <class Worker>
  void external_enqueue(Worker* self, caf::resumable* job) {
    enqueue(self->parent(), job);
  }

  template <class Worker>
  void internal_enqueue(Worker* self, caf::resumable* job) {
    enqueue(self->parent(), job);
  }

  // A job that yielded the thread goes to the back of the queue.
  template <class Worker>
  void resume_job_later(Worker* self, caf::resumable* job) {
    enqueue(self->parent(), job);
  }

  template <class Worker>
  caf::resumable* dequeue(Worker* self) {
    auto& data = d(self->parent());
    std::unique_lock<std::mutex> guard(data.lock);
    while (data.queue.empty()) {
      ++data.num_sleeping;
      data.cv.wait(guard);
      --data.num_sleeping;
    }
    caf::resumable* job = data.queue.front();
    data.queue.pop_front();
    return job;
  }

  template <class Worker, class UnaryFunction>
  void foreach_resumable(Worker*, UnaryFunction) {}

  // Used by the coordinator at shutdown to drop what is still queued.
  template <class Coordinator, class UnaryFunction>
  void foreach_central_resumable(Coordinator* self, UnaryFunction f) {
    auto& data = d(self);
    std::lock_guard<std::mutex> guard(data.lock);
    while (!data.queue.empty()) {
      caf::resumable* job = data.queue.front();
      data.queue.pop_front();
      f(job);
    }
  }
};

// Makes `config`'s actor system run its pool with the policy above (CAF uses a scheduler module
// loaded by the user instead of the one `scheduler.policy` names). `scheduler.max-threads`
// still sets the pool's size.
inline void use_wake_after_unlock_pool(caf::actor_system_config& config) {
  config.load<caf::scheduler::coordinator<wake_after_unlock_sharing>>();
}

}  // namespace troupe
