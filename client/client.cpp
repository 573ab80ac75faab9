#include "client/client.hpp"

#include <cstdio>
#include <random>

#include <zmq.hpp>

#include "protocol/codec.hpp"

namespace troupe {

struct client::impl {
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::dealer};
  std::string id_prefix;
  uint64_t next_id = 0;
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
  if (!impl_->socket.send(zmq::buffer(frame), zmq::send_flags::none)) {
    throw client_unreachable("cannot reach a server at " + endpoint_ + ": no connection within " +
                             seconds_text(connect_timeout_) + " (is `troupe serve` running there?)");
  }
}

void client::send(client_request request) {
  std::visit([&](auto& r) { if (r.api_key.empty()) r.api_key = api_key_; }, request);
  send_raw(encode_request(request));
}

std::optional<server_reply> client::receive(std::chrono::milliseconds timeout) {
  zmq::pollitem_t item{impl_->socket.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
  zmq::message_t message;
  if (!impl_->socket.recv(message, zmq::recv_flags::none)) return std::nullopt;
  return decode_reply(std::string_view(static_cast<const char*>(message.data()), message.size()));
}

completion client::generate(generate_request request,
                            const std::function<void(const delta_reply&)>& on_delta) {
  if (request.id.empty()) request.id = next_id();
  completion result;
  result.id = request.id;
  send(request);
  for (;;) {
    auto reply = receive(timeout_);
    if (!reply) {
      throw client_unreachable("no reply from " + endpoint_ + " to request '" + result.id + "' within " +
                               seconds_text(timeout_));
    }
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
    auto reply = receive(timeout_);
    if (!reply) throw client_unreachable("no reply from " + endpoint_ + " to a stats request within " + seconds_text(timeout_));
    if (auto* error = std::get_if<error_reply>(&*reply); error && error->id == id) {
      throw client_error(error->code, error->message);
    }
    if (auto* stats = std::get_if<stats_reply>(&*reply); stats && stats->id == id) return *stats;
  }
}

}  // namespace troupe
