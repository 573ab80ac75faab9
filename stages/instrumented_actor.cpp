#include "stages/instrumented_actor.hpp"

#include <algorithm>
#include <utility>

#include <caf/actor_system_config.hpp>
#include <caf/detail/behavior_impl.hpp>

namespace troupe {

namespace {

// A behaviour that hands each message to the actor's own and records what it took. Only a
// matched message counts: an unmatched one goes on to CAF's default handler untimed.
class instrumented_behavior : public caf::detail::behavior_impl {
 public:
  instrumented_behavior(caf::scheduled_actor* self, std::shared_ptr<actor_stats> stats, caf::behavior inner)
      : behavior_impl(inner.timeout()), self_(self), stats_(std::move(stats)), inner_(inner.as_behavior_impl()) {}

  caf::match_case::result invoke(caf::detail::invoke_result_visitor& f, caf::type_erased_tuple& xs) override {
    // On the actor's own thread, which is the one allowed to look into its mailbox; the message
    // being handled has left it already.
    const auto depth = static_cast<int64_t>(self_->mailbox().size());
    const timestamp_ns begin = steady_now_ns();
    const caf::match_case::result result = inner_->invoke(f, xs);
    if (result == caf::match_case::match) stats_->record(begin, steady_now_ns() - begin, depth);
    return result;
  }

  caf::match_case::result invoke_empty(caf::detail::invoke_result_visitor& f) override {
    return inner_->invoke_empty(f);
  }

  void handle_timeout() override { inner_->handle_timeout(); }

 private:
  caf::scheduled_actor* self_;  // the behaviour lives and runs inside this actor only
  std::shared_ptr<actor_stats> stats_;
  caf::intrusive_ptr<caf::detail::behavior_impl> inner_;
};

}  // namespace

std::shared_ptr<actor_stats> actor_stats_registry::add(std::string stage, caf::actor_id id, caf::actor_addr actor) {
  auto stats = std::make_shared<actor_stats>();
  std::lock_guard lock(mutex_);
  entries_.push_back({std::move(stage), id, std::move(actor), stats});
  return stats;
}

void actor_stats_registry::remove(caf::actor_id id) {
  std::lock_guard lock(mutex_);
  std::erase_if(entries_, [id](const entry& e) { return e.id == id; });
}

void actor_stats_registry::set_instance(caf::actor_id id, int32_t instance) {
  std::lock_guard lock(mutex_);
  for (entry& e : entries_) {
    if (e.id == id) e.instance = instance;
  }
}

void name_engine_instance(caf::scheduled_actor* self, int32_t instance) {
  if (actor_stats_registry* registry = stats_registry_of(self->system())) registry->set_instance(self->id(), instance);
}

std::shared_ptr<actor_stats> actor_stats_registry::find(caf::actor_id id) const {
  std::lock_guard lock(mutex_);
  for (const entry& e : entries_) {
    if (e.id == id) return e.stats;
  }
  return nullptr;
}

std::vector<actor_stats_registry::entry> actor_stats_registry::entries() const {
  std::lock_guard lock(mutex_);
  return entries_;
}

void actor_stats_registry::add_plugins(std::string stage, std::weak_ptr<const plugin_chain> chain) {
  std::lock_guard lock(mutex_);
  std::erase_if(plugins_, [](const auto& p) { return p.second.expired(); });
  plugins_.emplace_back(std::move(stage), std::move(chain));
}

std::vector<std::pair<std::string, plugin_counters>> actor_stats_registry::plugin_stage_counters() const {
  std::vector<std::pair<std::string, std::shared_ptr<const plugin_chain>>> live;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [stage, weak] : plugins_) {
      if (auto chain = weak.lock()) live.emplace_back(stage, std::move(chain));
    }
  }
  // Outside the lock: each chain's counters take their own locks.
  std::vector<std::pair<std::string, plugin_counters>> out;
  for (const auto& [stage, chain] : live) {
    for (plugin_counters& c : chain->counters()) out.emplace_back(stage, std::move(c));
  }
  return out;
}

void register_plugins(caf::actor_system& system, std::string stage, const std::shared_ptr<const plugin_chain>& chain) {
  actor_stats_registry* registry = stats_registry_of(system);
  if (registry && chain && !chain->empty()) registry->add_plugins(std::move(stage), chain);
}

actor_stats_registry* stats_registry_of(caf::actor_system& system) {
  const auto* host = dynamic_cast<const actor_stats_host*>(&system.config());
  return host ? &host->stats_registry() : nullptr;
}

caf::behavior instrumented(caf::scheduled_actor* self, std::string stage, caf::behavior inner) {
  actor_stats_registry* registry = stats_registry_of(self->system());
  if (!registry || !inner) return inner;
  const caf::actor_id id = self->id();
  auto stats = registry->add(std::move(stage), id, self->address());
  // The registry belongs to the system's config, which outlives every actor of the system.
  self->attach_functor([registry, id] { registry->remove(id); });
  caf::behavior::impl_ptr wrapped = caf::make_counted<instrumented_behavior>(self, std::move(stats), std::move(inner));
  return caf::behavior(std::move(wrapped));
}

response_timer::response_timer(std::shared_ptr<actor_stats> stats, int64_t mailbox_depth)
    : stats_(std::move(stats)), depth_(mailbox_depth), begin_(stats_ ? steady_now_ns() : 0) {}

response_timer::~response_timer() {
  if (stats_) stats_->record(begin_, steady_now_ns() - begin_, depth_);
}

response_timer timed_response(caf::scheduled_actor* self) {
  actor_stats_registry* registry = stats_registry_of(self->system());
  std::shared_ptr<actor_stats> stats = registry ? registry->find(self->id()) : nullptr;
  const int64_t depth = stats ? static_cast<int64_t>(self->mailbox().size()) : 0;
  return response_timer(std::move(stats), depth);
}

}  // namespace troupe
