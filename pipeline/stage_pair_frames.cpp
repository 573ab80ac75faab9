#include "pipeline/stage_pair_frames.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string_view>

namespace troupe {

namespace {

[[noreturn]] void refuse(const std::string& what) { throw std::invalid_argument("pipeline stage frame: " + what); }

template <class T>
void put(std::vector<std::byte>& out, T value) {
  const size_t at = out.size();
  out.resize(at + sizeof value);
  std::memcpy(out.data() + at, &value, sizeof value);
}

template <class T>
T get(std::span<const std::byte> in, size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof value);
  return value;
}

void put_header(stage_frame_kind kind, uint64_t exchange_id, int32_t num_block_ids, uint64_t payload_bytes,
                std::vector<std::byte>& out) {
  stage_frame_header h;
  h.kind = kind;
  h.step_id = exchange_id;
  h.num_block_ids = num_block_ids;
  h.payload_bytes = payload_bytes;
  out.assign(stage_frame_header_bytes, std::byte{0});
  encode_stage_frame_header(h, std::span<std::byte, stage_frame_header_bytes>(out.data(), stage_frame_header_bytes));
}

void put_text(std::vector<std::byte>& out, const std::string& text) {
  const size_t at = out.size();
  out.resize(at + text.size());
  if (!text.empty()) std::memcpy(out.data() + at, text.data(), text.size());
}

void check_text_fits(const std::string& text) {
  if (text.size() > stage_route_max_bytes) {
    throw std::invalid_argument("a KV route of " + std::to_string(text.size()) + " bytes, at most " +
                                std::to_string(stage_route_max_bytes));
  }
}

int32_t checked_timeout_ms(std::chrono::milliseconds timeout) {
  return static_cast<int32_t>(std::clamp<int64_t>(timeout.count(), 1, INT32_MAX));
}

}  // namespace

kv_stage_route decode_route_text(std::span<const std::byte> text) {
  try {
    return parse_kv_stage_route(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()));
  } catch (const std::invalid_argument& e) {
    refuse(e.what());
  }
}

void encode_stage_kv_lease(uint64_t exchange_id, const kv_stage_lease& lease, int num_layers,
                           std::vector<std::byte>& out) {
  const std::string route =
      kv_stage_route_text(kv_stage_route{layer_range::all(num_layers), lease.relay_endpoint, lease.relay_public_key});
  check_text_fits(route);
  const auto num_ids = static_cast<int32_t>(lease.block_ids.size());
  put_header(stage_frame_kind::kv_lease, exchange_id, num_ids,
             stage_lease_fixed_bytes + 4 * lease.block_ids.size() + route.size(), out);
  put(out, lease.transfer_id);
  put(out, lease.request_id);
  put(out, lease.num_tokens);
  put(out, checked_timeout_ms(lease.timeout));
  for (const int32_t id : lease.block_ids) put(out, id);
  put_text(out, route);
}

kv_stage_lease decode_stage_kv_lease(const stage_frame_header& h, std::span<const std::byte> payload) {
  const size_t ids_end = stage_lease_fixed_bytes + 4 * static_cast<size_t>(h.num_block_ids);
  if (h.kind != stage_frame_kind::kv_lease || payload.size() != h.payload_bytes || payload.size() < ids_end) {
    refuse("a KV lease of " + std::to_string(payload.size()) + " bytes does not hold its " +
           std::to_string(h.num_block_ids) + " block ids");
  }
  kv_stage_lease lease;
  lease.transfer_id = get<uint64_t>(payload, 0);
  lease.request_id = get<int64_t>(payload, 8);
  lease.num_tokens = get<int32_t>(payload, 16);
  const int32_t timeout_ms = get<int32_t>(payload, 20);
  if (lease.num_tokens <= 0) refuse("a KV lease of " + std::to_string(lease.num_tokens) + " tokens");
  if (timeout_ms <= 0) refuse("a KV lease with a timeout of " + std::to_string(timeout_ms) + " ms");
  lease.timeout = std::chrono::milliseconds(timeout_ms);
  lease.block_ids.resize(static_cast<size_t>(h.num_block_ids));
  if (!lease.block_ids.empty())
    std::memcpy(lease.block_ids.data(), payload.data() + stage_lease_fixed_bytes, ids_end - stage_lease_fixed_bytes);
  const kv_stage_route relay = decode_route_text(payload.subspan(ids_end));
  lease.relay_endpoint = relay.endpoint;
  lease.relay_public_key = relay.public_key;
  return lease;
}

void encode_stage_kv_push(uint64_t exchange_id, const kv_stage_push& push, std::vector<std::byte>& out) {
  const std::string route = kv_stage_route_text(push.to);
  check_text_fits(route);
  std::vector<std::byte> request;
  encode_kv_request(stage_frame_kind::kv_export, 0, push.span, push.block_ids, 0, request);
  const size_t request_bytes = request.size() - stage_frame_header_bytes;
  put_header(stage_frame_kind::kv_push, exchange_id, static_cast<int32_t>(push.block_ids.size()),
             stage_push_fixed_bytes + request_bytes + route.size(), out);
  put(out, push.transfer_id);
  put(out, push.request_id);
  put(out, push.token_begin);
  put(out, push.token_end);
  put(out, checked_timeout_ms(push.timeout));
  put(out, int32_t{push.last ? 1 : 0});
  out.insert(out.end(), request.begin() + stage_frame_header_bytes, request.end());
  put_text(out, route);
}

kv_stage_push decode_stage_kv_push(const stage_frame_header& h, std::span<const std::byte> payload) {
  const size_t request_end = stage_push_fixed_bytes + stage_kv_request_bytes(h);
  if (h.kind != stage_frame_kind::kv_push || payload.size() != h.payload_bytes || payload.size() < request_end) {
    refuse("a KV push of " + std::to_string(payload.size()) + " bytes does not hold its KV request");
  }
  kv_stage_push push;
  push.transfer_id = get<uint64_t>(payload, 0);
  push.request_id = get<int64_t>(payload, 8);
  push.token_begin = get<int32_t>(payload, 16);
  push.token_end = get<int32_t>(payload, 20);
  const int32_t timeout_ms = get<int32_t>(payload, 24);
  const int32_t last = get<int32_t>(payload, 28);
  if (push.token_begin < 0 || push.token_end <= push.token_begin) {
    refuse("a KV push of tokens [" + std::to_string(push.token_begin) + ", " + std::to_string(push.token_end) + ")");
  }
  if (timeout_ms <= 0) refuse("a KV push with a timeout of " + std::to_string(timeout_ms) + " ms");
  if (last != 0 && last != 1) refuse("a KV push's last flag is " + std::to_string(last));
  push.timeout = std::chrono::milliseconds(timeout_ms);
  push.last = last == 1;
  stage_frame_header as_export = h;
  as_export.kind = stage_frame_kind::kv_export;
  stage_kv_request request;
  decode_kv_request(as_export, payload.subspan(stage_push_fixed_bytes, request_end - stage_push_fixed_bytes), request);
  push.span = request.span;
  push.block_ids = std::move(request.block_ids);
  push.to = decode_route_text(payload.subspan(request_end));
  return push;
}

void encode_stage_kv_release(uint64_t exchange_id, uint64_t transfer_id, std::vector<std::byte>& out) {
  put_header(stage_frame_kind::kv_release, exchange_id, 0, stage_release_bytes, out);
  put(out, transfer_id);
}

uint64_t decode_stage_kv_release(std::span<const std::byte> payload) {
  if (payload.size() != stage_release_bytes) {
    refuse("a KV release of " + std::to_string(payload.size()) + " bytes, expected " +
           std::to_string(stage_release_bytes));
  }
  return get<uint64_t>(payload, 0);
}

}  // namespace troupe
