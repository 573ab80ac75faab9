#include "kvtransfer/kv_local_receivers.hpp"

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace troupe {

namespace {

struct entry {
  kv_frame_sink* sink = nullptr;
  int num_inside = 0;    // senders inside take_frame now
  bool leaving = false;  // unregistering: no new deliveries
};

struct registry {
  std::mutex mutex;
  std::condition_variable left;  // a delivery ended
  std::map<std::string, std::shared_ptr<entry>> receivers;
};

registry& the_registry() {
  static registry r;
  return r;
}

}  // namespace

void register_local_receiver(const std::string& endpoint, kv_frame_sink& sink) {
  registry& r = the_registry();
  std::lock_guard lock(r.mutex);
  auto [it, inserted] = r.receivers.emplace(endpoint, std::make_shared<entry>());
  if (!inserted) throw std::logic_error("kv receiver: endpoint " + endpoint + " is registered twice");
  it->second->sink = &sink;
}

void unregister_local_receiver(const std::string& endpoint) {
  registry& r = the_registry();
  std::unique_lock lock(r.mutex);
  auto it = r.receivers.find(endpoint);
  if (it == r.receivers.end()) return;
  std::shared_ptr<entry> e = it->second;
  e->leaving = true;
  r.receivers.erase(it);
  r.left.wait(lock, [&] { return e->num_inside == 0; });
}

bool deliver_to_local_receiver(const std::string& endpoint, std::span<const std::byte> header,
                               std::span<const std::byte> payload) {
  registry& r = the_registry();
  std::shared_ptr<entry> e;
  {
    std::lock_guard lock(r.mutex);
    auto it = r.receivers.find(endpoint);
    if (it == r.receivers.end() || it->second->leaving) return false;
    e = it->second;
    ++e->num_inside;
  }
  // Not under the registry's lock: deliveries to different receivers (or to one receiver from
  // several senders) do not wait on each other here.
  struct leave_on_exit {
    registry& r;
    entry& e;
    ~leave_on_exit() {
      std::lock_guard lock(r.mutex);
      --e.num_inside;
      r.left.notify_all();
    }
  } leave{r, *e};
  e->sink->take_frame(header, payload);
  return true;
}

}  // namespace troupe
