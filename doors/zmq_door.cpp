#include "doors/zmq_door.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "doors/access_log.hpp"
#include "doors/api_key.hpp"
#include "doors/zmq_request_table.hpp"
#include "grammar/guided_grammar.hpp"
#include "net/open_files.hpp"
#include "net/private_directory.hpp"
#include "net/relay_listener.hpp"
#include "protocol/codec.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

namespace {

// Linux silently caps a listen backlog at net.core.somaxconn; say so rather than let the
// configured value mislead.
void warn_if_backlog_capped(int backlog) {
  std::ifstream in("/proc/sys/net/core/somaxconn");
  int somaxconn = 0;
  if (in >> somaxconn && somaxconn > 0 && somaxconn < backlog) {
    spdlog::warn("zmq door: listen_backlog {} is capped by the kernel at net.core.somaxconn = {}", backlog, somaxconn);
  }
}

// "tcp://HOST:PORT" split; nullopt for another transport (ipc://, inproc://: local, no relay).
struct tcp_endpoint {
  std::string host;
  uint16_t port = 0;  // 0: "*", one the kernel chooses
};
std::optional<tcp_endpoint> parse_tcp_endpoint(const std::string& endpoint) {
  constexpr std::string_view scheme = "tcp://";
  if (endpoint.rfind(scheme, 0) != 0) return std::nullopt;
  const std::string rest = endpoint.substr(scheme.size());
  const size_t colon = rest.rfind(':');
  const std::string expected = " (expected tcp://HOST:PORT, PORT a number or *)";
  if (colon == std::string::npos || colon == 0) {
    throw std::runtime_error("zmq door: endpoint '" + endpoint + "' has no host and port" + expected);
  }
  tcp_endpoint parsed;
  parsed.host = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1);
  if (port == "*" || port == "0") return parsed;
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535) {
    throw std::runtime_error("zmq door: endpoint '" + endpoint + "' has port '" + port + "'" + expected);
  }
  parsed.port = static_cast<uint16_t>(std::stoi(port));
  return parsed;
}

}  // namespace

struct zmq_door::state {
  state(request_admission& admission, int max_prompt_tokens) : table(admission, max_prompt_tokens) {}

  // Declared first, so destroyed last: after the ROUTER has closed its socket in it.
  std::unique_ptr<private_directory> relay_directory;
  std::unique_ptr<relay_listener> relay;  // a tcp:// endpoint's listener; stopped before the ROUTER closes
  zmq::context_t context{1};
  zmq::socket_t router{context, zmq::socket_type::router};
  zmq::socket_t monitor{context, zmq::socket_type::pair};
  int wake_fd = -1;

  std::mutex inbox_mutex;
  std::vector<door_event> inbox;

  zmq_request_table table;

  ~state() {
    if (relay) relay->stop();
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void send_reply(const std::string& routing_id, const server_reply& reply) {
    std::string payload = encode_reply(reply);
    // ROUTER drops messages for unknown or gone peers; never blocks with dontwait.
    if (!router.send(zmq::buffer(routing_id), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return;
    (void)router.send(zmq::buffer(payload), zmq::send_flags::dontwait);
  }

  // A request refused before the table saw it (malformed, unauthorized, a constraint that does
  // not compile): its error reply, and its access line when the log is on.
  void send_error(const std::string& routing_id, std::string id, error_code code, std::string message) {
    if (access_log) log_refusal(refusal_entry{client_door::zmq, id, error_code_name(code), 0, message});
    send_reply(routing_id, error_reply{std::move(id), code, std::move(message)});
  }
  bool access_log = false;
};

zmq_door::zmq_door(zmq_door_options options, door_downstream& downstream, request_admission& admission)
    : options_(std::move(options)),
      downstream_(downstream),
      state_(std::make_unique<state>(admission, options_.max_prompt_tokens)) {
  state_->access_log = options_.access_log;
}

zmq_door::~zmq_door() { stop(); }

void zmq_door::start() {
  auto& s = *state_;
  s.router.set(zmq::sockopt::linger, 0);
  s.router.set(zmq::sockopt::rcvhwm, 100000);
  s.router.set(zmq::sockopt::sndhwm, 100000);
  // Connections the kernel queues before the door accepts them: a burst of clients beyond it
  // has its SYNs dropped and waits a second for the retry (docs/protocol.md, "Bursts of connections").
  s.router.set(zmq::sockopt::backlog, options_.listen_backlog);
  warn_if_backlog_capped(options_.listen_backlog);
  // Frames above max_frame_bytes get an error reply; frames far above it cost the peer its
  // connection, before libzmq buffers them whole.
  s.router.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options_.limits.max_frame_bytes) * 4);
  // Idle connections (a flood that never speaks ZMTP) are closed at this deadline; a real
  // client's handshake takes a round trip.
  s.router.set(zmq::sockopt::handshake_ivl, options_.handshake_timeout_ms);
  const std::optional<tcp_endpoint> tcp = parse_tcp_endpoint(options_.endpoint);
  std::string router_endpoint = options_.endpoint;
  if (tcp) {
    s.relay_directory = std::make_unique<private_directory>("troupe-zmq-door");
    router_endpoint = "ipc://" + s.relay_directory->path() + "/router.sock";
  }
  try {
    s.router.bind(router_endpoint);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error("zmq door: cannot bind " + router_endpoint + ": " + e.what());
  }
  if (tcp) {
    relay_listener_options relay;
    relay.host = tcp->host;
    relay.port = tcp->port;
    relay.backlog = options_.listen_backlog;
    relay.target_path = s.relay_directory->path() + "/router.sock";
    relay.limits.max_pending = std::max<size_t>(options_.max_pending_handshakes, 1);
    relay.limits.max_connections = options_.max_connections > 0
                                       ? options_.max_connections
                                       : door_connection_share(current_open_files_limit().soft, 3 * 4096) / 3;
    // Fewer pending slots than open ones: a client connecting during a flood of silent
    // connections then evicts the oldest of them instead of being refused until they time out
    // (under a low open-files limit the share, 21 connections at 256, was below the 64 slots,
    // and a client that gives up on a closed connection failed its request).
    if (relay.limits.max_pending >= relay.limits.max_connections) {
      relay.limits.max_pending = std::max<size_t>(relay.limits.max_connections / 2, 1);
    }
    relay.limits.handshake_timeout = std::chrono::milliseconds(options_.handshake_timeout_ms);
    relay.where = "zmq door";
    s.relay = std::make_unique<relay_listener>(std::move(relay));
    try {
      s.relay->start();
    } catch (const std::exception& e) {
      throw std::runtime_error("zmq door: cannot bind " + options_.endpoint + ": " + e.what());
    }
    bound_endpoint_ = "tcp://" + s.relay->bound_address();
    spdlog::info("zmq door: listening on {} (at most {} connections, {} in their handshake)", bound_endpoint_,
                 s.relay->limits().max_connections, s.relay->limits().max_pending);
  } else {
    // The endpoint actually bound: with a wildcard (ipc://...) only this line tells clients,
    // and the tests that start servers side by side, where to connect.
    bound_endpoint_ = s.router.get(zmq::sockopt::last_endpoint);
    spdlog::info("zmq door: listening on {}", bound_endpoint_);
  }
  std::string monitor_endpoint =
      "inproc://troupe-zmq-door-monitor-" + std::to_string(reinterpret_cast<uintptr_t>(this));
  if (zmq_socket_monitor(s.router.handle(), monitor_endpoint.c_str(), ZMQ_EVENT_DISCONNECTED) != 0) {
    throw std::runtime_error("zmq door: cannot monitor the ROUTER socket: " + std::string(zmq_strerror(zmq_errno())));
  }
  s.monitor.connect(monitor_endpoint);
  s.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.wake_fd < 0) throw std::runtime_error("zmq door: eventfd failed");
  thread_ = std::thread([this] { loop(); });
}

connection_counts zmq_door::connections() const {
  return state_->relay ? state_->relay->counts() : connection_counts{};
}

void zmq_door::stop() {
  // The relay first: no client reaches the ROUTER while the door winds down.
  if (state_->relay) state_->relay->stop();
  if (!thread_.joinable()) return;
  stopping_ = true;
  uint64_t one = 1;
  (void)::write(state_->wake_fd, &one, sizeof one);
  thread_.join();
}

void zmq_door::post(door_event event) {
  {
    std::lock_guard lock(state_->inbox_mutex);
    state_->inbox.push_back(std::move(event));
  }
  uint64_t one = 1;
  (void)::write(state_->wake_fd, &one, sizeof one);
}

void zmq_door::loop() {
  auto& s = *state_;
  const auto& limits = options_.limits;

  // Sends what the table asks for: replies to clients, work to the stages.
  auto deliver = [&](zmq_request_table::outputs out) {
    if (s.access_log) {
      for (const refusal_entry& refusal : out.refusals) log_refusal(refusal);
    }
    for (const auto& r : out.replies) s.send_reply(r.routing_id, r.reply);
    if (out.submit) downstream_.submit(std::move(*out.submit));
    for (int64_t request_id : out.aborts) downstream_.abort(request_id);
    if (out.stats_query) downstream_.query_stats(*out.stats_query);
  };

  // Nothing a peer sends may end this thread, which would end the process: a failure while
  // handling one message or event ends with that message, logged.
  auto contained = [](const char* what, auto&& handle) {
    try {
      handle();
    } catch (const std::exception& e) {
      spdlog::error("zmq door: {} failed: {}", what, e.what());
    } catch (...) {
      spdlog::error("zmq door: {} failed", what);
    }
  };

  auto on_request = [&](const std::string& routing_id, std::string_view frame) {
    auto decoded = decode_request(frame, limits);
    if (auto* error = std::get_if<protocol_error>(&decoded)) {
      s.send_error(routing_id, error->id, error->code, error->message);
      return;
    }
    auto& request = std::get<client_request>(decoded);
    const std::string& api_key = std::visit([](auto& r) -> const std::string& { return r.api_key; }, request);
    const std::string& id = std::visit([](auto& r) -> const std::string& { return r.id; }, request);
    const std::optional<std::string> key_tenant =
        options_.tenants && !api_key.empty() ? options_.tenants->tenant_of_key(api_key) : std::nullopt;
    const bool keyed = !options_.api_key.empty() || (options_.tenants && options_.tenants->has_keys());
    if (keyed && !key_tenant && (options_.api_key.empty() || !api_key_matches(api_key, options_.api_key))) {
      s.send_error(
          routing_id, id, error_code::unauthorized,
          api_key.empty() ? "field 'api_key': missing (this server requires a key)" : "field 'api_key': wrong key");
      return;
    }
    if (auto* generate = std::get_if<generate_request>(&request); generate && options_.tenants) {
      if (key_tenant) generate->targets.tenant = *key_tenant;
      options_.tenants->apply_defaults(generate->priority, generate->targets);
    }
    // A constraint that cannot be compiled is refused here, before admission, naming its part.
    if (auto* generate = std::get_if<generate_request>(&request)) {
      if (auto problem = check_guided_decoding(generate->sampling)) {
        s.send_error(routing_id, id, error_code::bad_request, "field '" + problem->field + "': " + problem->problem);
        return;
      }
    }
    deliver(s.table.on_request(routing_id, std::move(request), steady_now_ns()));
  };

  // Handles every disconnect event queued so far.
  auto drain_monitor = [&] {
    for (;;) {
      zmq::message_t event_frame, address_frame;
      if (!s.monitor.recv(event_frame, zmq::recv_flags::dontwait)) return;
      if (event_frame.more()) (void)s.monitor.recv(address_frame, zmq::recv_flags::dontwait);
      if (event_frame.size() >= 6) {
        uint16_t event_id;
        uint32_t value;
        std::memcpy(&event_id, event_frame.data(), 2);
        std::memcpy(&value, static_cast<const char*>(event_frame.data()) + 2, 4);
        if (event_id == ZMQ_EVENT_DISCONNECTED) deliver(s.table.on_disconnected(static_cast<int>(value)));
      }
    }
  };

  // One whole message from the ROUTER: its parts (the first few kept in `parts`) and how many
  // there were. False when none is waiting.
  std::vector<zmq::message_t> parts;
  size_t num_parts = 0;
  auto receive_message = [&] {
    parts.clear();
    num_parts = 0;
    zmq::message_t part;
    if (!s.router.recv(part, zmq::recv_flags::dontwait)) return false;
    bool more = part.more();
    parts.push_back(std::move(part));
    num_parts = 1;
    while (more) {
      zmq::message_t next;
      (void)s.router.recv(next, zmq::recv_flags::none);
      more = next.more();
      ++num_parts;
      // Keep only the first few parts: a message of thousands of parts costs nothing here.
      if (parts.size() <= limits.max_frames_per_message) parts.push_back(std::move(next));
    }
    return true;
  };

  auto on_message = [&] {
    const std::string routing_id = parts[0].to_string();
    if (parts.size() < 2) return;  // a peer with nothing to say
    // The descriptor the message came in on, to notice when its connection closes. A peer
    // speaking ZMTP/1.0 sends no metadata, so its messages carry none (-1): its disconnect then
    // goes unnoticed, but its requests are served.
    const int fd = zmq_msg_get(parts.back().handle(), ZMQ_SRCFD);
    if (fd >= 0 && !s.table.knows_peer(fd, routing_id)) {
      // A peer new on this descriptor, which may be a closed connection's, reused. That
      // connection's disconnect event was queued before this peer could even connect, but
      // may not be handled yet: handle it now, or it would later be taken for this peer's
      // and silently abort its requests (a client then waits forever for its reply).
      drain_monitor();
      s.table.add_peer(fd, routing_id);
    }
    if (num_parts > limits.max_frames_per_message || (num_parts == 3 && parts[1].size() != 0)) {
      s.send_error(routing_id, "", error_code::bad_request,
                   "a request is one msgpack frame (optionally after an empty delimiter), got " +
                       std::to_string(num_parts - 1) + " frames");
      return;
    }
    const auto& payload = parts.back();
    on_request(routing_id, std::string_view(static_cast<const char*>(payload.data()), payload.size()));
  };

  zmq::pollitem_t items[3] = {
      {s.router.handle(), 0, ZMQ_POLLIN, 0},
      {s.monitor.handle(), 0, ZMQ_POLLIN, 0},
      {nullptr, s.wake_fd, ZMQ_POLLIN, 0},
  };
  while (!stopping_) {
    try {
      zmq::poll(items, 3, std::chrono::milliseconds(200));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) {
        spdlog::error("zmq door: poll failed: {}", e.what());
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // not a busy loop if it persists
      }
      continue;
    }
    if (items[2].revents & ZMQ_POLLIN) {
      uint64_t count = 0;
      (void)::read(s.wake_fd, &count, sizeof count);
      std::vector<door_event> events;
      {
        std::lock_guard lock(s.inbox_mutex);
        events.swap(s.inbox);
      }
      for (auto& event : events) contained("a reply event", [&] { deliver(s.table.on_event(event, steady_now_ns())); });
    }
    if (items[1].revents & ZMQ_POLLIN) contained("a disconnect event", drain_monitor);
    if (items[0].revents & ZMQ_POLLIN) {
      // A bounded batch per wakeup, so replies and disconnects are never starved by a flood.
      for (int n = 0; n < 256; ++n) {
        bool received = false;
        contained("receiving a message", [&] { received = receive_message(); });
        if (!received) break;
        contained("a client's message", on_message);
      }
    }
  }
}

}  // namespace troupe
