#include "client/client.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

#include <zmq.hpp>

#include "protocol/codec.hpp"

namespace troupe {

struct client::impl {
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::dealer};
  // The socket's connection events (zmq_socket_monitor): a request whose connection closes is
  // never answered, so waiting on only the socket would sit out the whole request timeout. This
  // is what a peer that is not a troupe door looks like: an HTTP server on the port answers
  // ZeroMQ's greeting with "HTTP/1.1 400", which libzmq takes for an old ZMTP peer, so the
  // message goes out and the connection then closes.
  zmq::socket_t events{context, zmq::socket_type::pair};
  std::string id_prefix;
  uint64_t next_id = 0;

  // Forgets the events before a request goes out: only a loss after it counts against it.
  void forget_events() {
    while (take_event()) {
    }
  }
  // The name of a connection event waiting on `events` (a closed or refused connection), if any.
  std::optional<std::string> take_event() {
    zmq::message_t header;
    if (!events.recv(header, zmq::recv_flags::dontwait)) return std::nullopt;
    zmq::message_t address;  // every event is two frames; the second names the peer's address
    (void)events.recv(address, zmq::recv_flags::none);
    uint16_t event = 0;
    if (header.size() >= sizeof event) std::memcpy(&event, header.data(), sizeof event);
    return event == ZMQ_EVENT_DISCONNECTED ? "the connection closed" : "the ZeroMQ handshake failed";
  }
};

namespace {

std::string seconds_text(std::chrono::milliseconds t) {
  const double s = static_cast<double>(t.count()) / 1000.0;
  char text[32];
  std::snprintf(text, sizeof text, s == static_cast<int64_t>(s) ? "%.0f s" : "%.1f s", s);
  return text;
}

}  // namespace

client::client(const std::string& endpoint, std::string api_key)
    : impl_(std::make_unique<impl>()), endpoint_(endpoint), api_key_(std::move(api_key)) {
  impl_->socket.set(zmq::sockopt::linger, 0);
  // Messages go only to a connection that is up; a send waits for one at most the connect
  // timeout, so an endpoint nobody answers at is an error, not a message queued forever.
  impl_->socket.set(zmq::sockopt::immediate, 1);
  impl_->socket.set(zmq::sockopt::sndtimeo, static_cast<int>(connect_timeout_.count()));
  const std::string events_endpoint =
      "inproc://troupe-client-events-" + std::to_string(reinterpret_cast<uintptr_t>(impl_.get()));
  const int lost = ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                   ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
  if (zmq_socket_monitor(impl_->socket.handle(), events_endpoint.c_str(), lost) != 0) {
    throw std::runtime_error("cannot watch the connection to " + endpoint + ": " + zmq_strerror(zmq_errno()));
  }
  impl_->events.connect(events_endpoint);
  impl_->socket.connect(endpoint);
  std::random_device device;
  impl_->id_prefix = "c" + std::to_string(device() % 1000000) + "-";
}

client::~client() = default;
client::client(client&&) noexcept = default;
client& client::operator=(client&&) noexcept = default;

std::string client::next_id() { return impl_->id_prefix + std::to_string(impl_->next_id++); }

void client::set_connect_timeout(std::chrono::milliseconds timeout) {
  connect_timeout_ = timeout;
  impl_->socket.set(zmq::sockopt::sndtimeo, static_cast<int>(timeout.count()));
}

void client::send_raw(const std::string& frame) {
  impl_->forget_events();
  if (impl_->socket.send(zmq::buffer(frame), zmq::send_flags::none)) return;
  // Connections that were made and closed meanwhile: something listens there and turns them away.
  int num_closed = 0;
  while (impl_->take_event()) ++num_closed;
  if (num_closed > 0) {
    throw client_unreachable("cannot reach a server at " + endpoint_ + ": it closed the connection before the ZeroMQ " +
                             "handshake finished, " + std::to_string(num_closed) + " times within " +
                             seconds_text(connect_timeout_) +
                             " (a troupe door at its connection limit does, and says so in its log; or it is not "
                             "a troupe ZeroMQ door)");
  }
  throw client_unreachable("cannot reach a server at " + endpoint_ + ": no connection within " +
                           seconds_text(connect_timeout_) + " (is `troupe serve` running there?)");
}

void client::send(client_request request) {
  std::visit(
      [&](auto& r) {
        if (r.api_key.empty()) r.api_key = api_key_;
      },
      request);
  send_raw(encode_request(request));
}

std::optional<server_reply> client::receive(std::chrono::milliseconds timeout) {
  zmq::pollitem_t item{impl_->socket.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
  zmq::message_t message;
  if (!impl_->socket.recv(message, zmq::recv_flags::none)) return std::nullopt;
  return decode_reply(std::string_view(static_cast<const char*>(message.data()), message.size()));
}

std::optional<server_reply> client::receive_answer(std::chrono::milliseconds timeout, const std::string& what) {
  zmq::pollitem_t items[] = {{impl_->socket.handle(), 0, ZMQ_POLLIN, 0}, {impl_->events.handle(), 0, ZMQ_POLLIN, 0}};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    zmq::poll(items, 2, left);
    if (items[0].revents & ZMQ_POLLIN) return receive(std::chrono::milliseconds(0));
    if (items[1].revents & ZMQ_POLLIN) {
      if (auto loss = impl_->take_event()) {
        throw client_unreachable(*loss + " with " + endpoint_ + " before " + what +
                                 " was answered: is a troupe ZeroMQ door listening there (not its HTTP port)?");
      }
    }
  }
  throw client_unreachable("no reply from " + endpoint_ + " to " + what + " within " + seconds_text(timeout));
}

completion client::generate(generate_request request, const std::function<void(const delta_reply&)>& on_delta) {
  if (request.id.empty()) request.id = next_id();
  completion result;
  result.id = request.id;
  send(request);
  for (;;) {
    auto reply = receive_answer(timeout_, "request '" + result.id + "'");
    if (!reply) continue;  // a frame that did not decode
    if (auto* error = std::get_if<error_reply>(&*reply)) {
      if (error->id != result.id && !error->id.empty()) continue;
      throw client_error(error->code, error->message);
    }
    auto* delta = std::get_if<delta_reply>(&*reply);
    if (!delta || delta->id != result.id) continue;  // a stale reply of an earlier request
    result.text += delta->text;
    result.token_ids.insert(result.token_ids.end(), delta->token_ids.begin(), delta->token_ids.end());
    if (on_delta) on_delta(*delta);
    if (delta->finish_reason) {
      result.finish_reason = *delta->finish_reason;
      if (delta->usage) result.usage = *delta->usage;
      if (delta->timings) result.timings = *delta->timings;
      return result;
    }
  }
}

void client::abort(const std::string& id) { send(abort_request{id, {}}); }

stats_reply client::stats() {
  std::string id = next_id();
  send(stats_request{id, {}});
  for (;;) {
    auto reply = receive_answer(timeout_, "a stats request");
    if (!reply) continue;
    if (auto* error = std::get_if<error_reply>(&*reply); error && error->id == id) {
      throw client_error(error->code, error->message);
    }
    if (auto* stats = std::get_if<stats_reply>(&*reply); stats && stats->id == id) return *stats;
  }
}

}  // namespace troupe
