#include "node/tls_middleman.hpp"

#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include <caf/function_view.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/scoped_actor.hpp>

#include "net/tcp_connect.hpp"
#include "node/tls_connection.hpp"
#include "node/tls_doorman.hpp"
#include "stages/error_category.hpp"

namespace troupe {

namespace {

// The registry name of a system's TLS middleman (CAF atoms hold at most 10 characters).
constexpr caf::atom_value registry_key = caf::atom("troupe_tls");

// Handshake deadlines are checked this often; a deadline is kept within this much.
constexpr std::chrono::milliseconds expiry_period{100};

}  // namespace

// What the actor, its connections and the deadline thread share.
struct tls_plane_state {
  std::shared_ptr<const tls_context> context;
  tls_limits limits;
  std::shared_ptr<connection_guard> outgoing;  // no count limits: only the handshake deadline

  std::mutex mutex;
  std::vector<std::shared_ptr<connection_guard>> listeners;  // guarded by mutex
  std::condition_variable wake;
  bool stopping = false;  // guarded by mutex
  std::thread expiry;

  void add_listener(std::shared_ptr<connection_guard> guard) {
    std::lock_guard lock(mutex);
    listeners.push_back(std::move(guard));
  }

  void expire_until_stopped() {
    std::unique_lock lock(mutex);
    while (!wake.wait_for(lock, expiry_period, [&] { return stopping; })) {
      std::vector<std::shared_ptr<connection_guard>> guards = listeners;
      lock.unlock();
      outgoing->expire();
      for (const auto& guard : guards) guard->expire();
      lock.lock();
    }
  }
};

namespace {

class tls_middleman_actor : public caf::io::middleman_actor_impl {
 public:
  tls_middleman_actor(caf::actor_config& cfg, caf::actor broker, std::shared_ptr<tls_plane_state> state)
      : caf::io::middleman_actor_impl(cfg, std::move(broker)), state_(std::move(state)) {}

  const char* name() const override { return "troupe_tls_middleman"; }

 protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, uint16_t port) override {
    std::string why;
    // Bounded: a host that does not answer costs at most the handshake timeout, not the kernel's
    // two minutes of SYN retries (this actor makes every connection of the process in turn).
    const int fd = connect_tcp(host, port, state_->limits.connections.handshake_timeout, why);
    if (fd < 0) return caf::make_error(caf::sec::cannot_connect_to_node, why);
    const uint64_t ticket = state_->outgoing->admit(fd, host + ":" + std::to_string(port));
    tls_connection_bounds bounds{state_->outgoing, ticket, state_->limits.max_message_bytes};
    caf::io::scribe_ptr scribe = make_tls_scribe(mpx(), fd, *state_->context, false, std::move(bounds));
    if (!scribe) {
      ::close(fd);
      return caf::make_error(caf::sec::cannot_connect_to_node, "no TLS session for " + host);
    }
    return scribe;
  }

  caf::expected<caf::io::doorman_ptr> open(uint16_t port, const char* addr, bool reuse) override {
    auto fd = caf::io::network::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd) return std::move(fd.error());
    const auto bound = caf::io::network::local_port_of_fd(*fd);
    const std::string where =
        "TLS port " + std::string(addr ? addr : "*") + ":" + std::to_string(bound ? *bound : port);
    auto guard = std::make_shared<connection_guard>(state_->limits.connections, where);
    state_->add_listener(guard);
    return make_tls_doorman(mpx(), *fd, {state_->context, std::move(guard), state_->limits.max_message_bytes});
  }

 private:
  caf::io::network::default_multiplexer& mpx() {
    return static_cast<caf::io::network::default_multiplexer&>(system().middleman().backend());
  }

  std::shared_ptr<tls_plane_state> state_;
};

}  // namespace

tls_middleman::tls_middleman(caf::actor_system& system, const member_credentials& files, tls_limits limits)
    : system_(system), state_(std::make_shared<tls_plane_state>()) {
  // OpenSSL writes to sockets with write(2): a peer gone would kill the process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  state_->context = std::make_shared<const tls_context>(files);
  state_->limits = limits;
  connection_limits outgoing = limits.connections;
  outgoing.max_pending = std::numeric_limits<size_t>::max();
  outgoing.max_connections = std::numeric_limits<size_t>::max();
  state_->outgoing = std::make_shared<connection_guard>(outgoing, "outgoing TLS connections");
  auto broker = system.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  actor_ = system.spawn<tls_middleman_actor, caf::detached + caf::hidden>(std::move(broker), state_);
  system.registry().put(registry_key, actor_);
  state_->expiry = std::thread([state = state_] { state->expire_until_stopped(); });
}

tls_middleman::~tls_middleman() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  state_->expiry.join();
  system_.registry().erase(registry_key);
  caf::scoped_actor self{system_, true};
  self->send_exit(actor_, caf::exit_reason::kill);
  self->wait_for(actor_);
}

connection_counts tls_middleman::counts() const {
  connection_counts sum;
  std::lock_guard lock(state_->mutex);
  for (const auto& guard : state_->listeners) {
    const connection_counts c = guard->counts();
    sum.num_pending += c.num_pending;
    sum.num_established += c.num_established;
    sum.num_admitted += c.num_admitted;
    sum.num_refused += c.num_refused;
    sum.num_evicted += c.num_evicted;
    sum.num_timed_out += c.num_timed_out;
  }
  return sum;
}

caf::io::middleman_actor tls_middleman_of(caf::actor_system& system) {
  return system.registry().get<caf::io::middleman_actor>(registry_key);
}

caf::expected<uint16_t> tls_publish(caf::actor_system& system, const caf::actor& whom, uint16_t port,
                                    const std::string& host, std::chrono::milliseconds timeout) {
  const caf::io::middleman_actor tls = tls_middleman_of(system);
  if (!tls) return caf::make_error(error_code::internal, "this process has no TLS middleman");
  if (!whom) return caf::make_error(caf::sec::cannot_publish_invalid_actor);
  auto f = caf::make_function_view(tls, caf::duration{timeout});
  return f(caf::publish_atom::value, port, caf::actor_cast<caf::strong_actor_ptr>(whom), system.message_types(whom),
           host, true);
}

caf::expected<caf::actor> tls_remote_actor(caf::actor_system& system, const std::string& host, uint16_t port,
                                           std::chrono::milliseconds timeout) {
  const caf::io::middleman_actor tls = tls_middleman_of(system);
  if (!tls) return caf::make_error(error_code::internal, "this process has no TLS middleman");
  auto f = caf::make_function_view(tls, caf::duration{timeout});
  auto found = f(caf::connect_atom::value, host, port);
  if (!found) return std::move(found.error());
  auto& ptr = std::get<1>(*found);
  if (!ptr) return caf::make_error(caf::sec::no_actor_published_at_port);
  return caf::actor_cast<caf::actor>(std::move(ptr));
}

}  // namespace troupe
