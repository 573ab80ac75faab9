#pragma once
// ZAP (ZeroMQ RFC 27) for CURVE servers: ZeroMQ asks a REP socket bound to
// "inproc://zeromq.zap.01" in the server's context whether a client that passed the CURVE
// handshake may connect. Without such a handler ZeroMQ admits every client with any key, so a
// CURVE server binds one before its own socket. The KV receiver and the pipeline's stage server
// answer with this one function: a client is admitted only when its public key is among the
// cluster's members'.

#include <set>
#include <string>

#include <zmq.hpp>

namespace troupe {

inline constexpr const char* zap_endpoint = "inproc://zeromq.zap.01";

// Answers one request waiting on `zap` (non-blocking; nothing waiting: nothing happens).
// Returns who was refused ("a peer at ADDRESS with CURVE key KEY", or "... with no CURVE key"),
// or "" when the client was admitted or no request was waiting.
std::string answer_zap_request(zmq::socket_t& zap, const std::set<std::string>& allowed_public_keys);

}  // namespace troupe
