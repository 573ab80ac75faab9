#include "kvtransfer/curve_zap.hpp"

#include <vector>

namespace troupe {

std::string answer_zap_request(zmq::socket_t& zap, const std::set<std::string>& allowed_public_keys) {
  // Request frames: version, request id, domain, address, identity, mechanism, credentials...
  std::vector<zmq::message_t> request;
  do {
    request.emplace_back();
    if (!zap.recv(request.back(), zmq::recv_flags::dontwait)) return "";
  } while (request.back().more());
  auto text = [&](size_t i) { return i < request.size() ? request[i].to_string() : std::string(); };
  std::string key;
  if (text(5) == "CURVE" && request.size() > 6 && request[6].size() == 32) {
    char z85[41] = {};
    zmq_z85_encode(z85, static_cast<const uint8_t*>(request[6].data()), 32);
    key = z85;
  }
  const bool allowed = !key.empty() && allowed_public_keys.contains(key);
  const std::string status = allowed ? "200" : "400";
  const std::string status_text = allowed ? "OK" : "unknown key";
  zap.send(zmq::buffer(text(0)), zmq::send_flags::sndmore);
  zap.send(zmq::buffer(text(1)), zmq::send_flags::sndmore);
  zap.send(zmq::buffer(status), zmq::send_flags::sndmore);
  zap.send(zmq::buffer(status_text), zmq::send_flags::sndmore);
  zap.send(zmq::buffer(key), zmq::send_flags::sndmore);
  zap.send(zmq::message_t(), zmq::send_flags::none);
  if (allowed) return "";
  return "a peer at " + text(3) + " with " + (key.empty() ? "no CURVE key" : "CURVE key " + key);
}

}  // namespace troupe
