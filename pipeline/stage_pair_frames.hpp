#pragma once
// The payloads of the frames that give each pair of pipeline stages its own KV channel
// (kvtransfer/kv_stage_pairs.hpp), little-endian like every stage frame (pipeline/stage_frame.hpp):
//
//   kv_lease      transfer_id u64, request_id i64, num_tokens i32, timeout_ms i32,
//                 block ids i32[num_block_ids], then the engine receiver's route text
//   kv_lease_ack  the stage receiver's route text
//   kv_release    transfer_id u64
//   kv_push       transfer_id u64, request_id i64, token_begin i32, token_end i32, timeout_ms i32,
//                 last i32, then a KV request (descriptor and block ids, as kv_export's), then the
//                 decode stage receiver's route text
//
// A route's text is kvtransfer/kv_stage_pairs.hpp's (layers, endpoint, key), at most
// stage_route_max_bytes; a lease's relay names the whole model's layers. The header's counts are checked by
// decode_stage_frame_header before any of this is read; these check the rest.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtransfer/kv_stage_pairs.hpp"
#include "pipeline/stage_frame.hpp"

namespace troupe {

// A whole frame (header first) into `out`, numbered `exchange_id` (its step_id).
// A lease's relay route is the engine's receiver for every layer of a model of `num_layers`.
void encode_stage_kv_lease(uint64_t exchange_id, const kv_stage_lease& lease, int num_layers,
                           std::vector<std::byte>& out);
void encode_stage_kv_push(uint64_t exchange_id, const kv_stage_push& push, std::vector<std::byte>& out);
void encode_stage_kv_release(uint64_t exchange_id, uint64_t transfer_id, std::vector<std::byte>& out);

// Throw std::invalid_argument naming what is wrong: a payload whose size is not what its header
// implies, a count or token range that cannot be, a route whose text is not ENDPOINT\nKEY.
kv_stage_lease decode_stage_kv_lease(const stage_frame_header& header, std::span<const std::byte> payload);
kv_stage_push decode_stage_kv_push(const stage_frame_header& header, std::span<const std::byte> payload);
uint64_t decode_stage_kv_release(std::span<const std::byte> payload);

// A route's text in a payload: parse_kv_stage_route's, refused as a stage frame's.
kv_stage_route decode_route_text(std::span<const std::byte> text);

}  // namespace troupe
