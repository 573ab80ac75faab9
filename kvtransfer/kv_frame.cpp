#include "kvtransfer/kv_frame.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {

// Little-endian field codec over a fixed buffer; the layout below is the wire format.
class field_writer {
 public:
  explicit field_writer(std::span<std::byte, kv_frame_header_bytes> out) : out_(out) {}
  template <class T>
  void put(T value) {
    using U = std::make_unsigned_t<T>;
    U bits = static_cast<U>(value);
    for (size_t i = 0; i < sizeof(T); ++i) out_[at_++] = static_cast<std::byte>((bits >> (8 * i)) & 0xff);
  }

 private:
  std::span<std::byte, kv_frame_header_bytes> out_;
  size_t at_ = 0;
};

class field_reader {
 public:
  explicit field_reader(std::span<const std::byte> in) : in_(in) {}
  template <class T>
  T get() {
    using U = std::make_unsigned_t<T>;
    U bits = 0;
    for (size_t i = 0; i < sizeof(T); ++i) bits |= static_cast<U>(static_cast<U>(in_[at_++]) << (8 * i));
    return static_cast<T>(bits);
  }

 private:
  std::span<const std::byte> in_;
  size_t at_ = 0;
};

// The header's flags byte (once reserved, always 0 before).
constexpr uint8_t flag_in_place = 1;
constexpr uint8_t flag_sequenced = 2;
constexpr uint8_t flag_gave_up = 4;
constexpr uint8_t known_flags = flag_in_place | flag_sequenced | flag_gave_up;

[[noreturn]] void refuse(const std::string& why) { throw std::invalid_argument("kv frame: " + why); }

}  // namespace

void encode_kv_frame_header(const kv_frame_header& h, std::span<std::byte, kv_frame_header_bytes> out) {
  std::memset(out.data(), 0, out.size());
  field_writer w(out);
  w.put<uint32_t>(kv_frame_magic);
  w.put<uint16_t>(kv_frame_version);
  w.put<uint8_t>(static_cast<uint8_t>(h.span.element));
  w.put<uint8_t>((h.in_place ? flag_in_place : 0) | (h.sequenced ? flag_sequenced : 0) |
                 (h.gave_up ? flag_gave_up : 0));
  w.put<uint64_t>(h.transfer_id);
  w.put<int64_t>(h.request_id);
  w.put<int32_t>(h.token_begin);
  w.put<int32_t>(h.token_end);
  w.put<int32_t>(h.span.first_layer);
  w.put<int32_t>(h.span.num_layers);
  w.put<int32_t>(h.span.num_blocks);
  w.put<int32_t>(h.span.block_size);
  w.put<int32_t>(h.span.num_kv_heads);
  w.put<int32_t>(h.span.head_dim);
  w.put<uint64_t>(h.payload_bytes);
}

kv_frame_header decode_kv_frame_header(std::span<const std::byte> bytes, uint64_t max_payload_bytes) {
  if (bytes.size() != kv_frame_header_bytes) {
    refuse("the header has " + std::to_string(bytes.size()) + " bytes, expected " +
           std::to_string(kv_frame_header_bytes));
  }
  field_reader r(bytes);
  if (r.get<uint32_t>() != kv_frame_magic) refuse("bad magic: not a KV frame");
  if (const uint16_t version = r.get<uint16_t>(); version != kv_frame_version) {
    refuse("version " + std::to_string(version) + ", this build speaks " + std::to_string(kv_frame_version));
  }
  kv_frame_header h;
  const uint8_t element = r.get<uint8_t>();
  const uint8_t flags = r.get<uint8_t>();
  if ((flags & ~known_flags) != 0) refuse("unknown flags " + std::to_string(flags));
  h.in_place = (flags & flag_in_place) != 0;
  h.sequenced = (flags & flag_sequenced) != 0;
  if (h.sequenced && !h.in_place) refuse("a sequenced frame that is not in place");
  h.transfer_id = r.get<uint64_t>();
  h.request_id = r.get<int64_t>();
  h.token_begin = r.get<int32_t>();
  h.token_end = r.get<int32_t>();
  h.span.first_layer = r.get<int32_t>();
  h.span.num_layers = r.get<int32_t>();
  h.span.num_blocks = r.get<int32_t>();
  h.span.block_size = r.get<int32_t>();
  h.span.num_kv_heads = r.get<int32_t>();
  h.span.head_dim = r.get<int32_t>();
  h.payload_bytes = r.get<uint64_t>();
  h.gave_up = (flags & flag_gave_up) != 0;
  if (h.gave_up) {
    // Only who gave up and why: nothing of a span to check.
    if (h.in_place || h.sequenced) refuse("a give-up frame that also says in place or sequenced");
    if (h.payload_bytes > kv_frame_reason_max_bytes || h.payload_bytes > max_payload_bytes) {
      refuse("a give-up reason of " + std::to_string(h.payload_bytes) + " bytes, at most " +
             std::to_string(kv_frame_reason_max_bytes));
    }
    return h;
  }
  h.span.element = static_cast<dtype>(element);
  if (!is_kv_element(h.span.element)) {
    refuse("element type " + std::to_string(element) + " is not a KV cache type (f32, f16, bf16, q8_0, fp8_e4m3)");
  }
  if (h.span.block_size <= 0) refuse("block_size " + std::to_string(h.span.block_size) + " is not positive");
  if (h.token_begin < 0 || h.token_end <= h.token_begin) {
    refuse("token range [" + std::to_string(h.token_begin) + ", " + std::to_string(h.token_end) +
           ") is empty or negative");
  }
  if (h.token_begin % h.span.block_size != 0) {
    refuse("token_begin " + std::to_string(h.token_begin) + " is not a multiple of block_size " +
           std::to_string(h.span.block_size));
  }
  const int64_t blocks =
      (int64_t{h.token_end} + h.span.block_size - 1) / h.span.block_size - h.token_begin / h.span.block_size;
  if (h.span.num_blocks != blocks) {
    refuse("num_blocks " + std::to_string(h.span.num_blocks) + " does not cover tokens [" +
           std::to_string(h.token_begin) + ", " + std::to_string(h.token_end) + "): expected " +
           std::to_string(blocks));
  }
  if (h.span.num_layers <= 0 || h.span.first_layer < 0) {
    refuse("layer range first " + std::to_string(h.span.first_layer) + " count " + std::to_string(h.span.num_layers) +
           " is empty or negative");
  }
  const size_t span_bytes = kv_span_bytes(h.span);  // throws naming the field on overflow
  const size_t expected = h.sequenced ? kv_frame_sequence_bytes : h.in_place ? 0 : span_bytes;
  if (h.payload_bytes != expected) {
    if (h.in_place) {
      refuse("payload_bytes " + std::to_string(h.payload_bytes) + " in an in-place frame (expected " +
             std::to_string(expected) + ")");
    }
    refuse("payload_bytes " + std::to_string(h.payload_bytes) + " does not match the span's " +
           std::to_string(expected));
  }
  if (h.payload_bytes > max_payload_bytes) {
    refuse("payload of " + std::to_string(h.payload_bytes) + " bytes is above the limit of " +
           std::to_string(max_payload_bytes));
  }
  return h;
}

std::vector<std::byte> encode_kv_frame_sequence(uint64_t sequence) {
  std::vector<std::byte> out(kv_frame_sequence_bytes);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>((sequence >> (8 * i)) & 0xff);
  return out;
}

uint64_t decode_kv_frame_sequence(std::span<const std::byte> payload) {
  if (payload.size() != kv_frame_sequence_bytes) {
    refuse("a sequence of " + std::to_string(payload.size()) + " bytes, expected " +
           std::to_string(kv_frame_sequence_bytes));
  }
  uint64_t sequence = 0;
  for (size_t i = 0; i < payload.size(); ++i) sequence |= uint64_t(std::to_integer<uint8_t>(payload[i])) << (8 * i);
  return sequence;
}

kv_frame_header kv_give_up_header(uint64_t transfer_id, int64_t request_id, size_t reason_bytes) {
  kv_frame_header h;
  h.transfer_id = transfer_id;
  h.request_id = request_id;
  h.gave_up = true;
  h.payload_bytes = std::min(reason_bytes, kv_frame_reason_max_bytes);
  return h;
}

std::vector<std::byte> encode_kv_give_up_reason(const std::string& why) {
  const size_t n = std::min(why.size(), kv_frame_reason_max_bytes);
  std::vector<std::byte> out(n);
  if (n > 0) std::memcpy(out.data(), why.data(), n);
  return out;
}

}  // namespace troupe
