#pragma once
// msgpack encoding and strict decoding of the client plane's frames. Decoding never throws:
// a bad frame gives a protocol_error naming the field and the problem, and the server keeps going.

#include <string>
#include <string_view>
#include <variant>

#include "protocol/protocol_limits.hpp"
#include "protocol/replies.hpp"
#include "protocol/requests.hpp"

namespace troupe {

struct protocol_error {
  std::string id;  // the request's id when it could be read, else empty
  error_code code = error_code::bad_request;
  std::string message;
};

std::variant<client_request, protocol_error> decode_request(std::string_view frame, const protocol_limits& limits = {});
std::string encode_request(const client_request& request);

// Replies are produced by the server, so decoding them may throw std::runtime_error.
std::string encode_reply(const server_reply& reply);
server_reply decode_reply(std::string_view frame);

}  // namespace troupe
