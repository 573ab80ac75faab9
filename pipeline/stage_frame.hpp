#pragma once
// One frame between a pipelined model and one of its remote stages (pipeline/stage_link.hpp ->
// pipeline/stage_server.hpp and back), on a plain TCP connection: a fixed 48-byte header, then a
// payload whose size the header's counts fix exactly.
//
//   hello      link -> stage   stage_hello: the stage the link expects (layers, shapes)
//   hello_ack  stage -> link   stage_hello: what the stage holds (checked against the hello)
//   work       link -> stage   a micro-batch of a forward: the batch's arrays, then the residual
//                              stream entering the stage (absent for the first stage, which embeds)
//   result     stage -> link   the residual stream leaving the stage, [num_tokens, hidden_size]
//   failure    stage -> link   why the stage refused or could not run the frame (UTF-8 text)
//   kv_export  link -> stage   the KV of some of the stage's layers in some blocks, asked for
//   kv_data    stage -> link   those bytes (model/kv_transfer.hpp's span layout)
//   kv_import  link -> stage   KV for some of the stage's layers, to write into some blocks
//   kv_done    stage -> link   the import is in the stage's pool (no payload); a release or a push
//                              is done
//   kv_lease   link -> stage   a decode stage's lease on some blocks for one KV transfer, which it
//                              then receives straight from the prefill's matching stage
//                              (pipeline/stage_pair_frames.hpp)
//   kv_lease_ack stage -> link the stage's KV receiver for it (endpoint and key, as text)
//   kv_release link -> stage   the lease ends (a transfer id)
//   kv_push    link -> stage   a prefill stage sends some of its layers' KV of one request to the
//                              decode stage a route names
//
// The KV frames move a request's KV between a stage's pool and the engine that drives it (a
// pipelined prefill or decode instance of a disaggregated pair: the engine's KV plane carries it
// on). Their payload starts with a KV request: the span's descriptor (kv_span_header as seven
// i32: first_layer, num_layers, num_blocks, block_size, num_kv_heads, head_dim, element), then
// the block ids i32[num_block_ids]; an import's span bytes follow. A KV frame's data is bounded
// by the receiver's max_kv_bytes before it is read.
//
// Work payload, in order, little-endian (forward_batch's fields, model/forward_batch.hpp):
//   token_ids i32[n], positions i32[n], slot_mapping i64[n], query_start i32[s + 1],
//   context_lengths i32[s], block_table_start i32[s + 1], block_tables i32[b],
//   then the residual f32[n * hidden_size] when hidden_size > 0.
//
// Every field comes from the network: decode_stage_frame_header checks the header alone against
// the receiver's limits (magic, version, kind, counts, the payload size those counts imply)
// before a byte of the payload is read or allocated; decode_work_arrays checks the arrays' own
// consistency (offsets in order and in range, positions inside their sequence's context).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtransfer/kv_stage_pairs.hpp"
#include "model/forward_batch.hpp"
#include "model/kv_transfer.hpp"

namespace troupe {

inline constexpr uint32_t stage_frame_magic = 0x31535054;  // "TPS1" little-endian on the wire
inline constexpr uint16_t stage_frame_version = 2;
inline constexpr size_t stage_frame_header_bytes = 72;
inline constexpr size_t stage_failure_max_bytes = 4096;

enum class stage_frame_kind : uint16_t {
  hello = 1,
  hello_ack = 2,
  work = 3,
  result = 4,
  failure = 5,
  kv_export = 6,
  kv_data = 7,
  kv_import = 8,
  kv_done = 9,
  kv_lease = 10,
  kv_lease_ack = 11,
  kv_release = 12,
  kv_push = 13,
};

// The KV request at the start of a kv_export or kv_import payload, before the block ids.
inline constexpr size_t stage_kv_descriptor_bytes = 7 * 4;
// The fixed fields before a kv_lease's block ids and a kv_push's KV request, a kv_release's
// payload, and the most a route's text (a KV receiver's endpoint and key) may take.
inline constexpr size_t stage_lease_fixed_bytes = 24;
inline constexpr size_t stage_push_fixed_bytes = 32;
inline constexpr size_t stage_release_bytes = 8;
inline constexpr size_t stage_route_max_bytes = kv_stage_route_max_bytes;

struct stage_frame_header {
  stage_frame_kind kind = stage_frame_kind::work;
  uint64_t step_id = 0;      // work, result, failure: which forward (the link numbers them)
  uint32_t micro_batch = 0;  // the micro-batch's index within its forward
  int32_t num_tokens = 0;
  int32_t num_seqs = 0;
  int32_t num_block_ids = 0;
  int32_t hidden_size = 0;  // width of the residual rows the frame carries; 0: none
  // result: how long the stage computed the frame, in microseconds (its busy time, what `troupe
  // scale --list` shows as the stage's busy share); 0 in other frames.
  uint32_t compute_us = 0;
  uint64_t payload_bytes = 0;
  // result: the stage process's CPU since it began serving, all of it and its compute's, in
  // microseconds, and its process id: the engine's /metrics and `troupe plan` count the stage's
  // process beside the cluster's others. 0 in other frames.
  uint64_t process_cpu_us = 0;
  uint64_t compute_cpu_us = 0;
  uint32_t process_id = 0;
};

// What one stage is, as the hello and its answer say it.
struct stage_hello {
  int32_t first_layer = 0;
  int32_t end_layer = 0;   // one past the last
  int32_t num_layers = 0;  // the whole model's
  int32_t hidden_size = 0;
  int32_t vocab_size = 0;
  int32_t block_size = 0;
  int32_t num_blocks = 0;  // the KV pool's blocks (hello: the driver's; ack: the stage's): the
                           // pipeline schedules the fewest of them
};
inline constexpr size_t stage_hello_bytes = 7 * 4;

// The most a receiver accepts in one frame; a header past them is refused unread.
struct stage_frame_limits {
  int32_t max_tokens = 1 << 16;
  int32_t max_seqs = 1 << 12;
  int32_t max_block_ids = 1 << 20;
  int32_t hidden_size = 0;  // the only residual width accepted (0: none expected yet)
  // The most KV bytes one kv_import or kv_data frame may carry (0: none). A stage server: its
  // pool's bytes for its layers at the widest KV element; a link: exactly what it asked for.
  uint64_t max_kv_bytes = 0;
};

// The largest frame `limits` let through (header, arrays and residual at their bounds): what a
// message-based transport refuses beyond.
uint64_t stage_max_frame_bytes(const stage_frame_limits& limits);

void encode_stage_frame_header(const stage_frame_header& header, std::span<std::byte, stage_frame_header_bytes> out);
// Throws std::invalid_argument naming the field: wrong magic, version or kind, a negative count
// or one past `limits`, a residual width other than limits.hidden_size, payload_bytes other than
// the counts imply.
stage_frame_header decode_stage_frame_header(std::span<const std::byte> bytes, const stage_frame_limits& limits);

// The payload bytes a header's counts imply for its kind.
uint64_t stage_payload_bytes(const stage_frame_header& header);
// The work payload's bytes before the residual (its arrays).
uint64_t stage_work_array_bytes(const stage_frame_header& header);

// A work frame for `batch` (its arrays) and, when hidden_size > 0, `residual` [num_tokens,
// hidden_size]: the header and arrays in `head` (header first), the residual to be sent after it
// as it is (no copy).
void encode_work_frame(uint64_t step_id, uint32_t micro_batch, const forward_batch& batch, int32_t hidden_size,
                       std::vector<std::byte>& head);
// Fills `batch`'s arrays from a work payload's array part (`arrays`, stage_work_array_bytes
// long). Throws std::invalid_argument naming what is inconsistent; token ids are checked
// against `vocab_size` when it is positive (the first stage embeds them).
void decode_work_arrays(const stage_frame_header& header, std::span<const std::byte> arrays, int32_t vocab_size,
                        forward_batch& batch);

// A KV frame's request: which layers, blocks and element type (model/kv_transfer.hpp).
struct stage_kv_request {
  kv_span_header span;
  std::vector<int32_t> block_ids;
};

// The bytes of a kv_export or kv_import payload before an import's data: the descriptor and the
// block ids.
uint64_t stage_kv_request_bytes(const stage_frame_header& header);
// A kv_export (`data_bytes` 0) or kv_import frame's head for `span` over `block_ids`: the header,
// the descriptor and the ids; an import's data is sent after it as it is.
void encode_kv_request(stage_frame_kind kind, uint64_t step_id, const kv_span_header& span,
                       std::span<const int32_t> block_ids, uint64_t data_bytes, std::vector<std::byte>& head);
// Fills `request` from a KV frame's request part (`bytes`, stage_kv_request_bytes long). Throws
// std::invalid_argument naming what is wrong: a descriptor whose block count is not the
// header's, a span whose geometry or element type cannot be (kv_span_bytes), or an import whose
// data is not the span's bytes.
void decode_kv_request(const stage_frame_header& header, std::span<const std::byte> bytes, stage_kv_request& request);

std::vector<std::byte> encode_stage_hello(const stage_hello& hello);
// Throws std::invalid_argument for a payload that is not stage_hello_bytes long.
stage_hello decode_stage_hello(std::span<const std::byte> payload);

}  // namespace troupe
