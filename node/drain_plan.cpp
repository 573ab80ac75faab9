#include "node/drain_plan.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace troupe {

drain_plan::drain_plan(std::chrono::milliseconds timeout, std::chrono::milliseconds flush_limit)
    : timeout_(timeout), flush_limit_(flush_limit) {
  if (timeout.count() < 0 || flush_limit.count() < 0) {
    throw std::invalid_argument("drain_plan: the drain timeout and the flush limit must not be negative");
  }
}

void drain_plan::begin(clock::time_point now) {
  if (phase_ != phase::serving) return;
  phase_ = phase::draining;
  deadline_ = now + timeout_;
}

std::string drain_plan::refusal() const {
  return "the server is draining (shutting down): it takes no new requests; retry on another server";
}

drain_plan::action drain_plan::next(clock::time_point now, size_t num_running, bool interrupted) {
  switch (phase_) {
    case phase::serving: return action::wait;
    case phase::draining:
      if (num_running == 0) {
        phase_ = phase::stopped;
        return action::stop;
      }
      if (!interrupted && now < deadline_) return action::wait;
      end_reason_ = interrupted ? "the server was stopped during its drain (a second signal)"
                                : fmt::format("the server is shutting down: its drain timeout of {:g} s passed",
                                              static_cast<double>(timeout_.count()) / 1000);
      phase_ = phase::ending;
      deadline_ = now + flush_limit_;
      return action::end_the_rest;
    case phase::ending:
      if (num_running == 0 || now >= deadline_) {
        phase_ = phase::stopped;
        return action::stop;
      }
      return action::wait;
    case phase::stopped: return action::stop;
  }
  return action::stop;
}

}  // namespace troupe
