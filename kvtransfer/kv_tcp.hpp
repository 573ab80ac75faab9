#pragma once
// Plain TCP for the KV plane between peers without CURVE ("kvtcp://HOST:PORT" endpoints): each
// frame is its 64-byte header then its payload, back to back on one connection per sender and
// receiver. Blocking calls with bounded waits, as the plain socket copy the plane is measured
// against does: ZeroMQ's non-blocking I/O threads cost 1.2-1.6x that copy's CPU per transfer
// (docs/benchmarks.md, "KV transfer"), which on a loaded host is throughput. ZeroMQ stays for
// CURVE. Internal to kvtransfer (kv_sender and kv_receiver use it).

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace troupe {

inline constexpr std::string_view kv_tcp_scheme = "kvtcp://";

inline bool is_kv_tcp_endpoint(std::string_view endpoint) { return endpoint.starts_with(kv_tcp_scheme); }

// A listening socket on host:port (0: an ephemeral port), non-blocking; `endpoint` gets
// "kvtcp://HOST:PORT". Throws std::runtime_error naming the host and the system's reason.
// (Also the pipeline's stage links, pipeline/stage_server.hpp, which use the functions below.)
int kv_tcp_listen(const std::string& host, std::string& endpoint, int port = 0);
// A connection to a kvtcp:// endpoint within `connect_timeout`, blocking, whose writes wait at
// most `send_wait` for room; -1 with `why` set when there is none.
int kv_tcp_connect(const std::string& endpoint, std::chrono::milliseconds connect_timeout,
                   std::chrono::milliseconds send_wait, std::string& why);
// Makes an accepted connection blocking, its reads waiting at most `stall_timeout`.
void kv_tcp_prepare_accepted(int fd, std::chrono::milliseconds stall_timeout);

enum class kv_tcp_write { done, no_room, failed };
// Writes header and payload on a connection from kv_tcp_connect. no_room: the connection's send
// wait passed before the first byte went out (nothing written, the connection is intact); once a
// byte is out it keeps writing until done, or fails (`why` set; the stream is broken and must be
// closed) on an error or once `deadline` has passed.
kv_tcp_write kv_tcp_write_frame(int fd, std::span<const std::byte> header, std::span<const std::byte> payload,
                                std::chrono::steady_clock::time_point deadline, std::string& why);
// True when the receiver closed (or reset) the connection: a receiver never writes, so anything
// readable is the end of the stream. Looked at before each frame, so a sender reconnects instead
// of writing a frame into a connection that is gone.
bool kv_tcp_peer_closed(int fd);
// Reads exactly out.size() bytes from a kv_tcp_prepare_accepted connection: false (`why` says
// which) when the peer closes, nothing arrives for its stall timeout, or the bytes are not all
// in by `deadline` (checked at least once per stall timeout).
bool kv_tcp_read_exact(int fd, std::span<std::byte> out, std::chrono::steady_clock::time_point deadline,
                       std::string& why);

}  // namespace troupe
