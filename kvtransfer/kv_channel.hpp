#pragma once
// The KV data plane's settings and keys, shared by the sender and the receiver.
//
// Between processes the plane is plain TCP without CURVE keys (kv_tcp.hpp: the receiver
// listens on bind_host, a sender keeps one blocking connection per destination and writes each
// frame's header and payload back to back) and ZeroMQ with them (the receiver binds a PULL
// socket, a sender connects one PUSH socket per destination and sends each frame as a two-part
// message whose payload is handed to ZeroMQ without a copy), authenticated and encrypted with
// CURVE: a receiver accepts only senders whose public key is among allowed_public_keys (the
// cluster's members). Plain TCP replaced ZeroMQ where CURVE is not needed by measurement
// (docs/benchmarks.md, "KV transfer"). Inside one process a frame does not touch a socket: the
// sender hands it straight to the receiver (a direct copy into the pool).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

// CURVE keys in Z85 (40 characters each).
struct kv_channel_keys {
  std::string public_key;
  std::string secret_key;
  std::vector<std::string> allowed_public_keys;  // every member's public key (own included)

  bool empty() const { return secret_key.empty(); }
};

struct kv_channel_settings {
  std::string bind_host = "127.0.0.1";  // the receiver binds an ephemeral port here
  // The largest payload one frame may carry: a frame announcing more is refused unread.
  uint64_t max_payload_bytes = uint64_t(1) << 30;
  // Frames a sender may hold for transfers whose destination is not known yet, or not yet sent.
  uint64_t max_buffered_bytes = uint64_t(4) << 30;
  kv_channel_keys keys;  // empty: no CURVE (a single process, or a test)
  // A sender hands a frame for a receiver of its own process straight to it (no socket). Off:
  // every frame goes through the socket (tests and benchmarks of the socket path).
  bool allow_direct = true;
  // Between processes, without CURVE keys: plain TCP ("kvtcp://", kvtransfer/kv_tcp.hpp) instead
  // of ZeroMQ, the frame's header and payload on a blocking connection, read into a buffer kept
  // per connection: 1.2-1.4x ZeroMQ's throughput on loopback at a plain copy's CPU cost
  // (docs/benchmarks.md, "KV transfer"). With keys the receiver is always ZeroMQ (CURVE).
  // Senders follow the endpoint's scheme, so any sender reaches either kind of receiver.
  bool plain_tcp = true;
  // How long closing a sender's socket may wait for frames ZeroMQ still holds: a destructor
  // never hangs on a peer that is gone.
  std::chrono::milliseconds linger{1000};
  // A sender's payload buffers kept for reuse once their frames have left (kv_buffer_pool,
  // kv_sender::take_buffer): at most this much capacity (256 MiB: every frame of a 256 MiB
  // transfer, 12 layers of 21 MiB, comes back for the next one), and never more than its
  // max_buffered_bytes leaves beside the frames queued. All freed once no buffer was taken for
  // pooled_idle_release (jemalloc's own default decay for freed pages is 10 s too).
  uint64_t max_pooled_bytes = uint64_t(256) << 20;
  std::chrono::milliseconds pooled_idle_release{10000};
};

// The KV channel keys of member `name` in a credentials directory: NAME.kv.key (its key pair)
// and every *.kv.pub there (the members it accepts). Throws std::runtime_error naming a missing
// or malformed file.
kv_channel_keys load_kv_channel_keys(const std::filesystem::path& dir, std::string_view name);
// Writes NAME.kv.key (public and secret key, mode 0600) and NAME.kv.pub into `dir` (troupe
// certs calls it beside each member certificate). Refuses to overwrite unless `replace`.
void write_kv_channel_keys(const std::filesystem::path& dir, std::string_view name, bool replace = false);

}  // namespace troupe
