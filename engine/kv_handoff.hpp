#pragma once
// A request's part in prefill/decode disaggregation (docs/design/cluster.md, "Prefill/decode
// disaggregation"). The router gives a disaggregated request to two engine instances under one
// transfer id: the prefill instance computes the prompt, samples the first token and streams
// the request's KV out layer by layer (role send), then forgets the request; the decode instance
// reserves blocks for that KV, waits for it without computing (waiting_for_kv), and continues
// the request from the first token on (role receive).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

enum class kv_role : uint8_t {
  none,     // an ordinary request: this instance computes it from prompt to finish
  send,     // prefill only: stream the KV to the transfer's receiver, hand off after one token
  receive,  // decode only: the KV comes from a prefill instance, then the handed-off tokens
};

// The most bytes a peer name may have on the wire (a CAF actor address printed has ~60).
inline constexpr size_t max_kv_peer_bytes = 256;

struct kv_handoff {
  kv_role role = kv_role::none;
  uint64_t transfer_id = 0;  // fresh per routing: a late frame of an earlier attempt is refused
  // Role receive: the prefill instance the router chose, unique per process incarnation (its KV
  // agent's actor address, printed). kv_transport "nccl" keeps one communicator per prefill
  // peer and names it by this; a restarted prefill process is another peer.
  std::string peer;
};

// Blocks a decode instance reserved for a request whose KV is on its way: the KV receiver
// imports tokens [0, num_tokens) into them.
struct kv_reservation {
  int64_t request_id = 0;
  uint64_t transfer_id = 0;
  std::vector<int32_t> block_ids;
  int32_t num_tokens = 0;
  std::string peer;  // kv_handoff::peer: where the KV comes from
};

}  // namespace troupe
