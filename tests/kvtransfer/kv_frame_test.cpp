// The frame header on the wire: every field survives the round trip, and every header a lying
// or broken peer could send is refused by decode_kv_frame_header, naming the field, before the
// receiver sizes anything from it.

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kvtransfer/kv_frame.hpp"

namespace troupe {
namespace {

// A frame of layers [2, 5) for tokens [16, 37) of stories260K-like geometry: blocks of 16.
kv_frame_header good_header() {
  kv_frame_header h;
  h.transfer_id = 0x0123456789abcdefULL;
  h.request_id = -77;
  h.token_begin = 16;
  h.token_end = 37;
  h.span = {2, 3, 2, 16, 4, 8, dtype::bf16};  // blocks 1 and 2 of the request
  h.payload_bytes = kv_span_bytes(h.span);
  return h;
}

std::vector<std::byte> encoded(const kv_frame_header& h) {
  std::vector<std::byte> bytes(kv_frame_header_bytes);
  encode_kv_frame_header(h, std::span<std::byte, kv_frame_header_bytes>(bytes.data(), kv_frame_header_bytes));
  return bytes;
}

void expect_refused(const std::vector<std::byte>& bytes, const std::string& field, uint64_t limit = uint64_t(1) << 30) {
  try {
    decode_kv_frame_header(bytes, limit);
    ADD_FAILURE() << "accepted, expected a refusal naming " << field;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what() << " does not name " << field;
  }
}

void expect_refused(kv_frame_header h, const std::string& field) { expect_refused(encoded(h), field); }

// A give-up frame carries who gave up and why, nothing of a span; it says nothing else, and its
// reason is bounded.
TEST(kv_frame, a_give_up_frame_carries_its_reason_and_nothing_else) {
  const kv_frame_header h = kv_give_up_header(5, -3, 40);
  const kv_frame_header back = decode_kv_frame_header(encoded(h), uint64_t(1) << 30);
  EXPECT_TRUE(back.gave_up);
  EXPECT_EQ(back.transfer_id, 5u);
  EXPECT_EQ(back.request_id, -3);
  EXPECT_EQ(back.payload_bytes, 40u);
  EXPECT_EQ(encode_kv_give_up_reason(std::string(5000, 'r')).size(), kv_frame_reason_max_bytes);
  kv_frame_header both = h;
  both.in_place = true;
  expect_refused(both, "a give-up frame that also says in place");
  kv_frame_header long_reason = h;
  long_reason.payload_bytes = kv_frame_reason_max_bytes + 1;
  expect_refused(long_reason, "a give-up reason of 1025 bytes, at most 1024");
}

TEST(kv_frame, every_field_survives_the_round_trip) {
  const kv_frame_header h = good_header();
  const kv_frame_header back = decode_kv_frame_header(encoded(h), uint64_t(1) << 30);
  EXPECT_EQ(back.transfer_id, h.transfer_id);
  EXPECT_EQ(back.request_id, h.request_id);
  EXPECT_EQ(back.token_begin, h.token_begin);
  EXPECT_EQ(back.token_end, h.token_end);
  EXPECT_EQ(back.span.first_layer, h.span.first_layer);
  EXPECT_EQ(back.span.num_layers, h.span.num_layers);
  EXPECT_EQ(back.span.num_blocks, h.span.num_blocks);
  EXPECT_EQ(back.span.block_size, h.span.block_size);
  EXPECT_EQ(back.span.num_kv_heads, h.span.num_kv_heads);
  EXPECT_EQ(back.span.head_dim, h.span.head_dim);
  EXPECT_EQ(back.span.element, h.span.element);
  EXPECT_EQ(back.payload_bytes, h.payload_bytes);
}

TEST(kv_frame, an_in_place_frame_carries_no_payload_and_its_flag_survives) {
  kv_frame_header h = good_header();
  h.in_place = true;
  h.payload_bytes = 0;
  const std::vector<std::byte> bytes = encoded(h);
  EXPECT_EQ(bytes[7], std::byte{1});  // the flags byte, once reserved
  const kv_frame_header back = decode_kv_frame_header(bytes, uint64_t(1) << 30);
  EXPECT_TRUE(back.in_place);
  EXPECT_EQ(back.payload_bytes, 0u);
  EXPECT_FALSE(decode_kv_frame_header(encoded(good_header()), uint64_t(1) << 30).in_place);
  // In place with the span's bytes announced: a lie either way.
  h.payload_bytes = kv_span_bytes(h.span);
  expect_refused(h, "in an in-place frame");
  // Flags this build does not know are refused, not ignored.
  std::vector<std::byte> unknown = encoded(good_header());
  unknown[7] = std::byte{0x82};
  expect_refused(unknown, "unknown flags 130");
}

// kv_transport "nccl": an in-place frame names its send's place in the pair's order, in an
// 8-byte payload; a sequenced frame must be in place and carry exactly that payload.
TEST(kv_frame, a_sequenced_frame_carries_its_sequence_and_nothing_else) {
  kv_frame_header h = good_header();
  h.in_place = true;
  h.sequenced = true;
  h.payload_bytes = kv_frame_sequence_bytes;
  const std::vector<std::byte> bytes = encoded(h);
  EXPECT_EQ(bytes[7], std::byte{3});
  const kv_frame_header back = decode_kv_frame_header(bytes, uint64_t(1) << 30);
  EXPECT_TRUE(back.in_place);
  EXPECT_TRUE(back.sequenced);
  EXPECT_EQ(back.payload_bytes, kv_frame_sequence_bytes);
  EXPECT_EQ(decode_kv_frame_sequence(encode_kv_frame_sequence(0x0102030405060708ULL)), 0x0102030405060708ULL);
  EXPECT_EQ(encode_kv_frame_sequence(1)[0], std::byte{1}) << "little-endian";
  EXPECT_THROW(decode_kv_frame_sequence(std::vector<std::byte>(7)), std::invalid_argument);
  h.payload_bytes = 0;
  expect_refused(h, "in an in-place frame (expected 8)");
  h.in_place = false;
  h.payload_bytes = kv_frame_sequence_bytes;
  expect_refused(h, "a sequenced frame that is not in place");
}

TEST(kv_frame, the_wire_format_is_little_endian_and_starts_with_the_magic) {
  const std::vector<std::byte> bytes = encoded(good_header());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), 4), "TVK1");
  EXPECT_EQ(bytes[4], std::byte{1});  // version 1, low byte first
  EXPECT_EQ(bytes[5], std::byte{0});
}

TEST(kv_frame, a_lying_payload_size_is_refused) {
  kv_frame_header h = good_header();
  h.payload_bytes += 1;
  expect_refused(h, "payload_bytes");
  h.payload_bytes = uint64_t(1) << 40;
  expect_refused(h, "payload_bytes");
  h.payload_bytes = 0;
  expect_refused(h, "payload_bytes");
}

TEST(kv_frame, a_payload_above_the_limit_is_refused_although_it_matches_the_span) {
  const kv_frame_header h = good_header();
  expect_refused(encoded(h), "above the limit", h.payload_bytes - 1);
  EXPECT_NO_THROW(decode_kv_frame_header(encoded(h), h.payload_bytes));
}

TEST(kv_frame, num_blocks_must_cover_the_token_range) {
  kv_frame_header h = good_header();
  h.span.num_blocks = 3;
  h.payload_bytes = kv_span_bytes(h.span);  // consistent with the span, not with the tokens
  expect_refused(h, "num_blocks 3");
  h.span.num_blocks = 1;
  h.payload_bytes = kv_span_bytes(h.span);
  expect_refused(h, "num_blocks 1");
}

TEST(kv_frame, bad_magic_version_and_length_are_refused) {
  std::vector<std::byte> bytes = encoded(good_header());
  bytes[0] = std::byte{'X'};
  expect_refused(bytes, "magic");
  bytes = encoded(good_header());
  bytes[4] = std::byte{2};
  expect_refused(bytes, "version 2");
  bytes = encoded(good_header());
  bytes.pop_back();
  expect_refused(bytes, "63 bytes");
  expect_refused(std::vector<std::byte>{}, "0 bytes");
}

TEST(kv_frame, token_ranges_layers_and_element_types_are_checked) {
  expect_refused(
      [] {
        auto h = good_header();
        h.token_begin = 17;
        return h;
      }(),
      "token_begin 17");
  expect_refused(
      [] {
        auto h = good_header();
        h.token_end = 16;
        return h;
      }(),
      "token range");
  expect_refused(
      [] {
        auto h = good_header();
        h.token_begin = -16;
        return h;
      }(),
      "token range");
  expect_refused(
      [] {
        auto h = good_header();
        h.span.block_size = 0;
        return h;
      }(),
      "block_size");
  expect_refused(
      [] {
        auto h = good_header();
        h.span.num_layers = 0;
        return h;
      }(),
      "layer range");
  expect_refused(
      [] {
        auto h = good_header();
        h.span.first_layer = -1;
        return h;
      }(),
      "layer range");
  expect_refused(
      [] {
        auto h = good_header();
        h.span.element = dtype::q4_k;
        return h;
      }(),
      "element type");
}

TEST(kv_frame, sizes_that_overflow_are_refused_not_wrapped) {
  // Every field at its largest: the span's size does not fit in 64 bits. A wrapped product
  // could otherwise equal a small payload_bytes and pass.
  kv_frame_header h = good_header();
  h.token_begin = 0;
  h.token_end = 0x7fffffff;
  h.span.block_size = 1;
  h.span.num_blocks = 0x7fffffff;
  h.span.num_layers = 0x7fffffff;
  h.span.num_kv_heads = 0x7fffffff;
  h.span.head_dim = 0x7fffffff;
  h.payload_bytes = 64;
  try {
    decode_kv_frame_header(encoded(h), uint64_t(1) << 30);
    ADD_FAILURE() << "an overflowing span was accepted";
  } catch (const std::invalid_argument& e) {
    SUCCEED() << e.what();
  }
}

}  // namespace
}  // namespace troupe
