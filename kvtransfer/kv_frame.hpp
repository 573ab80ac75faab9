#pragma once
// One frame of a request's KV on the data plane (kv_sender -> kv_receiver): a fixed-size header,
// then the span's bytes exactly as model::export_kv writes them (model/kv_transfer.hpp). A
// prefill instance sends a request's KV as frames of one layer each, chunk by chunk, while the
// next layer computes; the decode instance imports each into the blocks it reserved.
//
// A frame carries the K/V of tokens [token_begin, token_end) of the request as the whole blocks
// that hold them: blocks [token_begin / block_size, ceil(token_end / block_size)) of the
// request's block table, in order. token_begin is block-aligned; a block a chunk left partly
// filled is sent again, whole, with the next chunk (the later copy is the complete one).
//
// Every field comes from the network: decode_kv_frame_header checks the header alone (magic,
// version, sizes that overflow or exceed the limits), the receiver checks it against the
// transfer it expects before it reads or allocates a byte of the payload.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/kv_transfer.hpp"

namespace troupe {

inline constexpr uint32_t kv_frame_magic = 0x314b5654;  // "TVK1" little-endian on the wire
inline constexpr uint16_t kv_frame_version = 1;

struct kv_frame_header {
  uint64_t transfer_id = 0;  // names one transfer of one request (a fresh id per routing)
  int64_t request_id = 0;
  int32_t token_begin = 0;     // block-aligned
  int32_t token_end = 0;       // > token_begin
  kv_span_header span;         // span.num_blocks == blocks covering [token_begin, token_end)
  uint64_t payload_bytes = 0;  // == kv_span_bytes(span), or 0 when in_place
  // A device transport (CUDA IPC, NCCL) already wrote the span into the receiver's blocks; the
  // frame carries no payload and only tells the receiver's lease that these tokens are in. A
  // receiver accepts it only for a transfer it expects in place (kv_expectation::in_place).
  bool in_place = false;
  // With in_place (kv_transport "nccl"): the payload is the frame's place in its pair's order
  // (kv_frame_sequence_bytes, encode_kv_frame_sequence). NCCL pairs sends and receives in posting
  // order, and the sender may hand over frames of different transfers in another order than
  // their sends were posted: the receiver posts its receives in this order, not in arrival order.
  bool sequenced = false;
  // The sender gave the transfer up (it cannot send the rest: its stream broke, a pipeline stage
  // could not take or send its layers): the payload is why, UTF-8 text of at most
  // kv_frame_reason_max_bytes; the token and span fields mean nothing. The receiver fails the
  // transfer at once with that reason instead of waiting for its deadline.
  bool gave_up = false;
};

// The encoded header's size on the wire (fixed, little-endian fields).
inline constexpr size_t kv_frame_header_bytes = 64;
// The payload of a sequenced frame: its sequence number, little-endian.
inline constexpr size_t kv_frame_sequence_bytes = 8;
// The most a give-up frame's reason may take.
inline constexpr size_t kv_frame_reason_max_bytes = 1024;

void encode_kv_frame_header(const kv_frame_header& header, std::span<std::byte, kv_frame_header_bytes> out);
// Throws std::invalid_argument naming the field: wrong magic or version, a negative or empty
// range, num_blocks that does not match the token range, payload_bytes != kv_span_bytes(span)
// (0 for an in-place frame) or above max_payload_bytes, an unknown element type or flag.
kv_frame_header decode_kv_frame_header(std::span<const std::byte> bytes, uint64_t max_payload_bytes);

std::vector<std::byte> encode_kv_frame_sequence(uint64_t sequence);  // [kv_frame_sequence_bytes]

// A give-up frame for a transfer of `request_id`, and its payload (`why`, cut to
// kv_frame_reason_max_bytes).
kv_frame_header kv_give_up_header(uint64_t transfer_id, int64_t request_id, size_t reason_bytes);
std::vector<std::byte> encode_kv_give_up_reason(const std::string& why);
// Throws std::invalid_argument for a payload that is not kv_frame_sequence_bytes long.
uint64_t decode_kv_frame_sequence(std::span<const std::byte> payload);

}  // namespace troupe
