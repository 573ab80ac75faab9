#include "pipeline/stage_frame.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace troupe {

namespace {

// Little-endian fields at fixed offsets (x86 and ARM servers are little-endian; memcpy keeps the
// reads aligned-agnostic).
template <class T>
void put(std::byte* out, size_t offset, T value) {
  std::memcpy(out + offset, &value, sizeof value);
}

template <class T>
T get(const std::byte* in, size_t offset) {
  T value;
  std::memcpy(&value, in + offset, sizeof value);
  return value;
}

[[noreturn]] void refuse(const std::string& what) { throw std::invalid_argument("pipeline stage frame: " + what); }

void check_count(const char* name, int64_t value, int64_t most) {
  if (value < 0 || value > most) {
    refuse(std::string(name) + " " + std::to_string(value) + " is outside 0.." + std::to_string(most));
  }
}

// Copies `count` values of T from the payload at `offset` into `out`, advancing the offset.
template <class T>
void take(std::span<const std::byte> payload, size_t& offset, int64_t count, std::vector<T>& out) {
  out.resize(static_cast<size_t>(count));
  const size_t bytes = static_cast<size_t>(count) * sizeof(T);
  if (bytes > 0) std::memcpy(out.data(), payload.data() + offset, bytes);
  offset += bytes;
}

template <class T>
void append(std::vector<std::byte>& out, const std::vector<T>& values) {
  const size_t at = out.size();
  out.resize(at + values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data() + at, values.data(), values.size() * sizeof(T));
}

}  // namespace

void encode_stage_frame_header(const stage_frame_header& h, std::span<std::byte, stage_frame_header_bytes> out) {
  std::byte* p = out.data();
  std::memset(p, 0, stage_frame_header_bytes);
  put(p, 0, stage_frame_magic);
  put(p, 4, stage_frame_version);
  put(p, 6, static_cast<uint16_t>(h.kind));
  put(p, 8, h.step_id);
  put(p, 16, h.micro_batch);
  put(p, 20, h.num_tokens);
  put(p, 24, h.num_seqs);
  put(p, 28, h.num_block_ids);
  put(p, 32, h.hidden_size);
  put(p, 36, h.compute_us);
  put(p, 40, h.payload_bytes);
  put(p, 48, h.process_cpu_us);
  put(p, 56, h.compute_cpu_us);
  put(p, 64, h.process_id);
}

uint64_t stage_max_frame_bytes(const stage_frame_limits& limits) {
  stage_frame_header most;
  most.kind = stage_frame_kind::work;
  most.num_tokens = limits.max_tokens;
  most.num_seqs = std::min(limits.max_seqs, limits.max_tokens);
  most.num_block_ids = limits.max_block_ids;
  most.hidden_size = limits.hidden_size;
  const uint64_t kv =
      stage_kv_descriptor_bytes + uint64_t{4} * static_cast<uint64_t>(limits.max_block_ids) + limits.max_kv_bytes;
  // A push's fixed fields and route besides a KV request (a lease's are fewer).
  const uint64_t pair = stage_push_fixed_bytes + stage_route_max_bytes;
  return stage_frame_header_bytes + std::max({stage_payload_bytes(most), uint64_t{stage_failure_max_bytes}, kv + pair});
}

uint64_t stage_kv_request_bytes(const stage_frame_header& h) {
  return stage_kv_descriptor_bytes + uint64_t{4} * static_cast<uint64_t>(h.num_block_ids);
}

uint64_t stage_work_array_bytes(const stage_frame_header& h) {
  const uint64_t n = static_cast<uint64_t>(h.num_tokens);
  const uint64_t s = static_cast<uint64_t>(h.num_seqs);
  const uint64_t b = static_cast<uint64_t>(h.num_block_ids);
  return n * (4 + 4 + 8) + (s + 1) * 4 + s * 4 + (s + 1) * 4 + b * 4;
}

uint64_t stage_payload_bytes(const stage_frame_header& h) {
  const uint64_t residual = static_cast<uint64_t>(h.num_tokens) * static_cast<uint64_t>(h.hidden_size) * 4;
  switch (h.kind) {
    case stage_frame_kind::hello:
    case stage_frame_kind::hello_ack: return stage_hello_bytes;
    case stage_frame_kind::work: return stage_work_array_bytes(h) + residual;
    case stage_frame_kind::result: return residual;
    case stage_frame_kind::failure: return h.payload_bytes;  // text of its own length, bounded below
    case stage_frame_kind::kv_export: return stage_kv_request_bytes(h);
    case stage_frame_kind::kv_data:
    case stage_frame_kind::kv_import: return h.payload_bytes;  // the span's bytes, bounded below
    case stage_frame_kind::kv_done: return 0;
    case stage_frame_kind::kv_lease:
    case stage_frame_kind::kv_lease_ack:
    case stage_frame_kind::kv_push: return h.payload_bytes;  // a route's text of its own length, bounded below
    case stage_frame_kind::kv_release: return stage_release_bytes;
  }
  return 0;
}

stage_frame_header decode_stage_frame_header(std::span<const std::byte> bytes, const stage_frame_limits& limits) {
  if (bytes.size() != stage_frame_header_bytes) {
    refuse("header of " + std::to_string(bytes.size()) + " bytes, expected " +
           std::to_string(stage_frame_header_bytes));
  }
  const std::byte* p = bytes.data();
  if (get<uint32_t>(p, 0) != stage_frame_magic) refuse("bad magic (not a pipeline stage frame)");
  if (get<uint16_t>(p, 4) != stage_frame_version) {
    refuse("version " + std::to_string(get<uint16_t>(p, 4)) + ", expected " + std::to_string(stage_frame_version));
  }
  stage_frame_header h;
  const uint16_t kind = get<uint16_t>(p, 6);
  if (kind < static_cast<uint16_t>(stage_frame_kind::hello) ||
      kind > static_cast<uint16_t>(stage_frame_kind::kv_push)) {
    refuse("unknown kind " + std::to_string(kind));
  }
  h.kind = static_cast<stage_frame_kind>(kind);
  h.step_id = get<uint64_t>(p, 8);
  h.micro_batch = get<uint32_t>(p, 16);
  h.num_tokens = get<int32_t>(p, 20);
  h.num_seqs = get<int32_t>(p, 24);
  h.num_block_ids = get<int32_t>(p, 28);
  h.hidden_size = get<int32_t>(p, 32);
  h.compute_us = get<uint32_t>(p, 36);
  h.payload_bytes = get<uint64_t>(p, 40);
  h.process_cpu_us = get<uint64_t>(p, 48);
  h.compute_cpu_us = get<uint64_t>(p, 56);
  h.process_id = get<uint32_t>(p, 64);
  check_count("num_tokens", h.num_tokens, limits.max_tokens);
  check_count("num_seqs", h.num_seqs, std::min(limits.max_seqs, h.num_tokens));
  check_count("num_block_ids", h.num_block_ids, limits.max_block_ids);
  if (h.kind == stage_frame_kind::result && h.hidden_size == 0 && h.num_tokens > 0)
    refuse("a result without its residual");
  if (h.hidden_size != 0 && h.hidden_size != limits.hidden_size) {
    refuse("residual width " + std::to_string(h.hidden_size) + ", expected " + std::to_string(limits.hidden_size));
  }
  const bool kv = h.kind >= stage_frame_kind::kv_export;
  if (kv && (h.num_tokens != 0 || h.num_seqs != 0 || h.hidden_size != 0)) {
    refuse("a KV frame carries no tokens, sequences or residual");
  }
  const auto bytes_beyond = [&](uint64_t before) -> int64_t {
    if (h.payload_bytes < before) {
      refuse("payload of " + std::to_string(h.payload_bytes) + " bytes, its KV request alone takes " +
             std::to_string(before));
    }
    return static_cast<int64_t>(std::min<uint64_t>(h.payload_bytes - before, INT64_MAX));
  };
  const auto most_kv = static_cast<int64_t>(std::min<uint64_t>(limits.max_kv_bytes, INT64_MAX));
  if (h.kind == stage_frame_kind::failure) {
    check_count("failure text bytes", static_cast<int64_t>(std::min<uint64_t>(h.payload_bytes, INT64_MAX)),
                stage_failure_max_bytes);
  } else if (h.kind == stage_frame_kind::kv_data) {
    check_count("KV data bytes", bytes_beyond(0), most_kv);
  } else if (h.kind == stage_frame_kind::kv_import) {
    check_count("KV data bytes", bytes_beyond(stage_kv_request_bytes(h)), most_kv);
  } else if (h.kind == stage_frame_kind::kv_lease) {
    check_count("route text bytes",
                bytes_beyond(stage_lease_fixed_bytes + uint64_t{4} * static_cast<uint64_t>(h.num_block_ids)),
                stage_route_max_bytes);
  } else if (h.kind == stage_frame_kind::kv_push) {
    check_count("route text bytes", bytes_beyond(stage_push_fixed_bytes + stage_kv_request_bytes(h)),
                stage_route_max_bytes);
  } else if (h.kind == stage_frame_kind::kv_lease_ack) {
    check_count("route text bytes", bytes_beyond(0), stage_route_max_bytes);
  } else if (h.payload_bytes != stage_payload_bytes(h)) {
    refuse("payload of " + std::to_string(h.payload_bytes) + " bytes, its counts make " +
           std::to_string(stage_payload_bytes(h)));
  }
  return h;
}

void encode_work_frame(uint64_t step_id, uint32_t micro_batch, const forward_batch& batch, int32_t hidden_size,
                       std::vector<std::byte>& head) {
  stage_frame_header h;
  h.kind = stage_frame_kind::work;
  h.step_id = step_id;
  h.micro_batch = micro_batch;
  h.num_tokens = batch.num_tokens();
  h.num_seqs = batch.num_seqs();
  h.num_block_ids = static_cast<int32_t>(batch.block_tables.size());
  h.hidden_size = hidden_size;
  h.payload_bytes = stage_payload_bytes(h);
  head.assign(stage_frame_header_bytes, std::byte{0});
  encode_stage_frame_header(h, std::span<std::byte, stage_frame_header_bytes>(head.data(), stage_frame_header_bytes));
  append(head, batch.token_ids);
  append(head, batch.positions);
  append(head, batch.slot_mapping);
  append(head, batch.query_start);
  append(head, batch.context_lengths);
  append(head, batch.block_table_start);
  append(head, batch.block_tables);
}

void decode_work_arrays(const stage_frame_header& h, std::span<const std::byte> arrays, int32_t vocab_size,
                        forward_batch& batch) {
  if (arrays.size() != stage_work_array_bytes(h)) {
    refuse("work arrays of " + std::to_string(arrays.size()) + " bytes, expected " +
           std::to_string(stage_work_array_bytes(h)));
  }
  size_t at = 0;
  const int64_t n = h.num_tokens;
  const int64_t s = h.num_seqs;
  take(arrays, at, n, batch.token_ids);
  take(arrays, at, n, batch.positions);
  take(arrays, at, n, batch.slot_mapping);
  take(arrays, at, s + 1, batch.query_start);
  take(arrays, at, s, batch.context_lengths);
  take(arrays, at, s + 1, batch.block_table_start);
  take(arrays, at, h.num_block_ids, batch.block_tables);
  batch.logits_rows.clear();
  batch.hidden_rows.clear();
  batch.hidden_out = nullptr;
  batch.after_layer_kv = nullptr;
  // Offsets run from 0 to their array's end without going back; each token's position lies in
  // its sequence's context (the model checks blocks and slots against its pool).
  auto check_offsets = [&](const std::vector<int32_t>& starts, int64_t end, const char* name) {
    if (starts.front() != 0 || starts.back() != end)
      refuse(std::string(name) + " must run from 0 to " + std::to_string(end));
    for (size_t i = 1; i < starts.size(); ++i) {
      if (starts[i] < starts[i - 1]) refuse(std::string(name) + " goes back at sequence " + std::to_string(i - 1));
    }
  };
  check_offsets(batch.query_start, n, "query_start");
  check_offsets(batch.block_table_start, h.num_block_ids, "block_table_start");
  for (int64_t i = 0; i < s; ++i) {
    const int32_t context = batch.context_lengths[static_cast<size_t>(i)];
    for (int32_t t = batch.query_start[static_cast<size_t>(i)]; t < batch.query_start[static_cast<size_t>(i) + 1];
         ++t) {
      const int32_t position = batch.positions[static_cast<size_t>(t)];
      if (position < 0 || position >= context) {
        refuse("token " + std::to_string(t) + " at position " + std::to_string(position) + " outside its context of " +
               std::to_string(context));
      }
    }
  }
  if (vocab_size > 0) {
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = batch.token_ids[static_cast<size_t>(t)];
      if (id < 0 || id >= vocab_size) {
        refuse("token id " + std::to_string(id) + " outside the vocabulary of " + std::to_string(vocab_size));
      }
    }
  }
}

void encode_kv_request(stage_frame_kind kind, uint64_t step_id, const kv_span_header& span,
                       std::span<const int32_t> block_ids, uint64_t data_bytes, std::vector<std::byte>& head) {
  stage_frame_header h;
  h.kind = kind;
  h.step_id = step_id;
  h.num_block_ids = static_cast<int32_t>(block_ids.size());
  h.payload_bytes = stage_kv_request_bytes(h) + data_bytes;
  head.assign(stage_frame_header_bytes, std::byte{0});
  encode_stage_frame_header(h, std::span<std::byte, stage_frame_header_bytes>(head.data(), stage_frame_header_bytes));
  const int32_t fields[] = {span.first_layer,
                            span.num_layers,
                            span.num_blocks,
                            span.block_size,
                            span.num_kv_heads,
                            span.head_dim,
                            static_cast<int32_t>(span.element)};
  const size_t at = head.size();
  head.resize(at + sizeof fields + block_ids.size_bytes());
  std::memcpy(head.data() + at, fields, sizeof fields);
  if (!block_ids.empty()) std::memcpy(head.data() + at + sizeof fields, block_ids.data(), block_ids.size_bytes());
}

void decode_kv_request(const stage_frame_header& h, std::span<const std::byte> bytes, stage_kv_request& request) {
  if (bytes.size() != stage_kv_request_bytes(h)) {
    refuse("KV request of " + std::to_string(bytes.size()) + " bytes, expected " +
           std::to_string(stage_kv_request_bytes(h)));
  }
  int32_t f[7];
  std::memcpy(f, bytes.data(), sizeof f);
  kv_span_header& span = request.span;
  span.first_layer = f[0];
  span.num_layers = f[1];
  span.num_blocks = f[2];
  span.block_size = f[3];
  span.num_kv_heads = f[4];
  span.head_dim = f[5];
  if (f[6] < 0 || f[6] > UINT8_MAX) refuse("KV element type " + std::to_string(f[6]) + " is not one");
  span.element = static_cast<dtype>(f[6]);
  if (span.num_blocks != h.num_block_ids) {
    refuse("the KV request names " + std::to_string(span.num_blocks) + " blocks and carries " +
           std::to_string(h.num_block_ids) + " ids");
  }
  size_t at = stage_kv_descriptor_bytes;
  take(bytes, at, h.num_block_ids, request.block_ids);
  uint64_t span_bytes = 0;
  try {
    span_bytes = kv_span_bytes(span);
  } catch (const std::invalid_argument& e) {
    refuse(std::string("KV span: ") + e.what());
  }
  if (h.kind == stage_frame_kind::kv_import && h.payload_bytes - bytes.size() != span_bytes) {
    refuse("KV import of " + std::to_string(h.payload_bytes - bytes.size()) + " data bytes, its span takes " +
           std::to_string(span_bytes));
  }
}

std::vector<std::byte> encode_stage_hello(const stage_hello& hello) {
  std::vector<std::byte> out(stage_hello_bytes);
  const int32_t fields[] = {hello.first_layer, hello.end_layer,  hello.num_layers, hello.hidden_size,
                            hello.vocab_size,  hello.block_size, hello.num_blocks};
  std::memcpy(out.data(), fields, sizeof fields);
  return out;
}

stage_hello decode_stage_hello(std::span<const std::byte> payload) {
  if (payload.size() != stage_hello_bytes) {
    refuse("hello of " + std::to_string(payload.size()) + " bytes, expected " + std::to_string(stage_hello_bytes));
  }
  int32_t f[7];
  std::memcpy(f, payload.data(), sizeof f);
  return {f[0], f[1], f[2], f[3], f[4], f[5], f[6]};
}

}  // namespace troupe
