#pragma once
// One end of a pipeline stage link, frame by frame (pipeline/stage_frame.hpp), over either
// transport:
//   kvtcp://HOST:PORT        plain TCP (kvtransfer/kv_tcp.hpp): no credentials, loopback only;
//   curve://HOST:PORT/KEY    ZeroMQ PAIR sockets with CURVE: the stage is the server whose public
//                            key is KEY (Z85), and it admits only the cluster's members' keys
//                            (kvtransfer/curve_zap.hpp), as the KV plane does.
// A frame is written as its head (header and arrays) and tail (residual); it is read as its
// 48-byte header first, which the reader checks before it reads (or, over ZeroMQ, copies) a byte
// of the payload. Over ZeroMQ a frame is one message, bounded in size by the socket
// (ZMQ_MAXMSGSIZE) before it is received whole.

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "kvtransfer/kv_channel.hpp"
#include "pipeline/stage_frame.hpp"

namespace troupe {

inline constexpr std::string_view curve_stage_scheme = "curve://";

class stage_channel {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  virtual ~stage_channel() = default;

  // Writes one frame; why not, or "".
  virtual std::string write(std::span<const std::byte> head, std::span<const std::byte> tail, time_point deadline) = 0;
  // Waits up to `wait` for a frame to start arriving; false when none did.
  virtual bool readable(std::chrono::milliseconds wait) = 0;
  // Reads the next frame's header (a payload left unread of the previous frame is dropped);
  // why not, or "".
  virtual std::string read_header(std::span<std::byte, stage_frame_header_bytes> header, time_point deadline) = 0;
  // Reads the next out.size() bytes of the current frame's payload; why not, or "".
  virtual std::string read(std::span<std::byte> out, time_point deadline) = 0;
  // Between frames, on the engine's end: whether the stage went away (its process died, the
  // connection closed); why, or "" while it is there. Does not wait.
  virtual std::string peer_gone() = 0;
};

// A plain TCP connection (kv_tcp_connect or accepted), owned from here on.
std::unique_ptr<stage_channel> tcp_stage_channel(int fd);

// The stage's end of a CURVE link: a PAIR socket bound on HOST:PORT (port 0: any) with `keys`
// (its own key pair; clients admitted by allowed_public_keys). `endpoint` gets
// "curve://HOST:PORT/PUBLIC_KEY". Frames above max_frame_bytes are refused by ZeroMQ unread.
std::unique_ptr<stage_channel> curve_stage_server(const std::string& host, int port, const kv_channel_keys& keys,
                                                  uint64_t max_frame_bytes, std::string& endpoint);
// The engine's end: a PAIR socket connected to a curve:// endpoint with its own `keys`. Throws
// std::runtime_error naming a malformed endpoint.
std::unique_ptr<stage_channel> curve_stage_client(const std::string& endpoint, const kv_channel_keys& keys,
                                                  uint64_t max_frame_bytes);

bool is_curve_stage_endpoint(std::string_view endpoint);

}  // namespace troupe
