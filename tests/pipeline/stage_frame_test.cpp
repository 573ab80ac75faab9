// The pipeline's stage frames (issue 27): what a stage reads off the network is refused by name
// when its header lies (sizes, counts, widths, kind) before anything is allocated, and a work
// frame's arrays are checked for consistency before a model sees them.

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipeline/pipelined_model.hpp"
#include "pipeline/stage_frame.hpp"
#include "pipeline/stage_load.hpp"
#include "pipeline/stage_pair_frames.hpp"

namespace troupe {
namespace {

// Two sequences: 3 new tokens of a 5-token context, and 1 of 2.
forward_batch sample_batch() {
  forward_batch b;
  b.token_ids = {4, 5, 6, 7};
  b.positions = {2, 3, 4, 1};
  b.slot_mapping = {2, 3, 4, 9};
  b.query_start = {0, 3, 4};
  b.context_lengths = {5, 2};
  b.block_table_start = {0, 2, 3};
  b.block_tables = {0, 1, 2};
  return b;
}

std::string refusal(auto&& call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

stage_frame_header header_of(const std::vector<std::byte>& head, const stage_frame_limits& limits) {
  return decode_stage_frame_header(std::span(head.data(), stage_frame_header_bytes), limits);
}

TEST(stage_frame, a_work_frame_round_trips) {
  const forward_batch b = sample_batch();
  std::vector<std::byte> head;
  encode_work_frame(7, 1, b, 16, head);
  stage_frame_limits limits;
  limits.hidden_size = 16;
  const stage_frame_header h = header_of(head, limits);
  EXPECT_EQ(h.kind, stage_frame_kind::work);
  EXPECT_EQ(h.step_id, 7u);
  EXPECT_EQ(h.micro_batch, 1u);
  EXPECT_EQ(h.payload_bytes, stage_work_array_bytes(h) + 4u * 16u * 4u);
  forward_batch back;
  decode_work_arrays(h, std::span(head).subspan(stage_frame_header_bytes), 100, back);
  EXPECT_EQ(back.token_ids, b.token_ids);
  EXPECT_EQ(back.positions, b.positions);
  EXPECT_EQ(back.slot_mapping, b.slot_mapping);
  EXPECT_EQ(back.query_start, b.query_start);
  EXPECT_EQ(back.context_lengths, b.context_lengths);
  EXPECT_EQ(back.block_table_start, b.block_table_start);
  EXPECT_EQ(back.block_tables, b.block_tables);
}

// A result frame carries the stage's compute time (its busy share in `troupe scale --list`) and
// its process's CPU (/metrics counts the stage process beside the cluster's others).
TEST(stage_frame, a_result_frame_carries_the_stages_compute_time_and_process_cpu) {
  stage_frame_header result;
  result.kind = stage_frame_kind::result;
  result.step_id = 9;
  result.num_tokens = 3;
  result.hidden_size = 16;
  result.compute_us = 4'000'000'000u;
  result.process_cpu_us = 123'456'789'012u;
  result.compute_cpu_us = 98'765'432'109u;
  result.process_id = 4'000'000'001u;
  result.payload_bytes = stage_payload_bytes(result);
  std::vector<std::byte> head(stage_frame_header_bytes);
  encode_stage_frame_header(result,
                            std::span<std::byte, stage_frame_header_bytes>(head.data(), stage_frame_header_bytes));
  stage_frame_limits limits;
  limits.hidden_size = 16;
  const stage_frame_header back = header_of(head, limits);
  EXPECT_EQ(back.compute_us, 4'000'000'000u);
  EXPECT_EQ(back.payload_bytes, 3u * 16u * 4u);
  EXPECT_EQ(back.process_cpu_us, 123'456'789'012u);
  EXPECT_EQ(back.compute_cpu_us, 98'765'432'109u);
  EXPECT_EQ(back.process_id, 4'000'000'001u);
  EXPECT_EQ(stage_process_identity("curve://10.0.0.7:7101/abc:def", 42), "10.0.0.7:42");
  EXPECT_EQ(stage_process_identity("kvtcp://127.0.0.1:7101", 7), "127.0.0.1:7");
}

TEST(stage_frame, lying_headers_are_refused_before_the_payload) {
  std::vector<std::byte> head;
  encode_work_frame(1, 0, sample_batch(), 16, head);
  stage_frame_limits limits;
  limits.hidden_size = 16;
  auto with = [&](size_t offset, auto value) {
    std::vector<std::byte> bad(head.begin(), head.begin() + stage_frame_header_bytes);
    std::memcpy(bad.data() + offset, &value, sizeof value);
    return refusal([&] { header_of(bad, limits); });
  };
  EXPECT_NE(with(0, uint32_t{0x12345678}).find("bad magic"), std::string::npos);
  EXPECT_NE(with(4, uint16_t{9}).find("version 9"), std::string::npos);
  EXPECT_NE(with(6, uint16_t{77}).find("unknown kind 77"), std::string::npos);
  EXPECT_NE(with(20, int32_t{-1}).find("num_tokens -1"), std::string::npos);
  EXPECT_NE(with(20, int32_t{1 << 20}).find("num_tokens"), std::string::npos);  // past max_tokens
  EXPECT_NE(with(24, int32_t{9}).find("num_seqs 9"), std::string::npos);        // more sequences than tokens
  EXPECT_NE(with(28, int32_t{1 << 30}).find("num_block_ids"), std::string::npos);
  EXPECT_NE(with(32, int32_t{17}).find("residual width 17, expected 16"), std::string::npos);
  EXPECT_NE(with(40, uint64_t{1} << 40).find("its counts make"), std::string::npos);  // the size lies
  stage_frame_header failure;
  failure.kind = stage_frame_kind::failure;
  failure.payload_bytes = stage_failure_max_bytes + 1;
  std::array<std::byte, stage_frame_header_bytes> text_head{};
  encode_stage_frame_header(failure, text_head);
  EXPECT_NE(refusal([&] { decode_stage_frame_header(text_head, limits); }).find("failure text bytes"),
            std::string::npos);
}

// KV frames (a pipelined prefill's or decode's KV moving through the engine that drives the
// stages): the request round-trips; sizes that lie, data past the receiver's bound, a block count
// other than the ids carried and element types that are not KV types are refused by name, before
// any data is read.
TEST(stage_frame, kv_frames_round_trip_and_lying_ones_are_refused) {
  const kv_span_header span{.first_layer = 1,
                            .num_layers = 2,
                            .num_blocks = 3,
                            .block_size = 4,
                            .num_kv_heads = 2,
                            .head_dim = 8,
                            .element = dtype::f16};
  const std::vector<int32_t> ids = {7, 2, 9};
  const uint64_t data_bytes = kv_span_bytes(span);  // 2 layers x K,V x 3 blocks x 4 x 2 x 8 x 2 bytes
  ASSERT_EQ(data_bytes, 2u * 2u * 3u * 4u * 2u * 8u * 2u);
  stage_frame_limits limits;
  limits.max_kv_bytes = data_bytes;
  std::vector<std::byte> head;
  encode_kv_request(stage_frame_kind::kv_import, 42, span, ids, data_bytes, head);
  const stage_frame_header h = header_of(head, limits);
  EXPECT_EQ(h.kind, stage_frame_kind::kv_import);
  EXPECT_EQ(h.step_id, 42u);
  EXPECT_EQ(h.num_block_ids, 3);
  EXPECT_EQ(h.payload_bytes, stage_kv_descriptor_bytes + 3 * 4 + data_bytes);
  stage_kv_request back;
  decode_kv_request(h, std::span(head).subspan(stage_frame_header_bytes), back);
  EXPECT_EQ(back.block_ids, ids);
  EXPECT_EQ(back.span.first_layer, 1);
  EXPECT_EQ(back.span.num_layers, 2);
  EXPECT_EQ(back.span.head_dim, 8);
  EXPECT_EQ(back.span.element, dtype::f16);

  // More data than the receiver takes: refused from the header alone.
  stage_frame_limits smaller = limits;
  smaller.max_kv_bytes = data_bytes - 1;
  EXPECT_NE(refusal([&] { header_of(head, smaller); }).find("KV data bytes"), std::string::npos);
  // An export asks for nothing but the request; its payload must be exactly that.
  encode_kv_request(stage_frame_kind::kv_export, 1, span, ids, 0, head);
  EXPECT_EQ(header_of(head, limits).payload_bytes, stage_kv_descriptor_bytes + 3 * 4);
  auto with = [&](size_t offset, auto value) {
    std::vector<std::byte> bad(head.begin(), head.begin() + stage_frame_header_bytes);
    std::memcpy(bad.data() + offset, &value, sizeof value);
    return refusal([&] { header_of(bad, limits); });
  };
  EXPECT_NE(with(40, uint64_t{1} << 40).find("its counts make"), std::string::npos);
  EXPECT_NE(with(20, int32_t{5}).find("a KV frame carries no tokens"), std::string::npos);
  // kv_data from a stage: bounded by what was asked for.
  stage_frame_header data;
  data.kind = stage_frame_kind::kv_data;
  data.payload_bytes = data_bytes + 1;
  std::array<std::byte, stage_frame_header_bytes> data_head{};
  encode_stage_frame_header(data, data_head);
  EXPECT_NE(refusal([&] { decode_stage_frame_header(data_head, limits); }).find("KV data bytes"), std::string::npos);

  // The request itself: its block count against the ids, its element type, an import's data
  // against its span.
  auto request_refusal = [&](stage_frame_kind kind, kv_span_header edited, uint64_t edited_data) {
    std::vector<std::byte> frame;
    encode_kv_request(kind, 1, edited, ids, edited_data, frame);
    stage_frame_limits any;
    any.max_kv_bytes = uint64_t{1} << 30;
    const stage_frame_header eh = header_of(frame, any);
    stage_kv_request r;
    return refusal([&] { decode_kv_request(eh, std::span(frame).subspan(stage_frame_header_bytes), r); });
  };
  kv_span_header two_blocks = span;
  two_blocks.num_blocks = 2;
  EXPECT_NE(request_refusal(stage_frame_kind::kv_export, two_blocks, 0).find("names 2 blocks and carries 3 ids"),
            std::string::npos);
  kv_span_header q4 = span;
  q4.element = dtype::q4_0;
  EXPECT_NE(request_refusal(stage_frame_kind::kv_export, q4, 0).find("KV span"), std::string::npos);
  EXPECT_NE(request_refusal(stage_frame_kind::kv_import, span, data_bytes - 2).find("its span takes"),
            std::string::npos);
}

// The frames of a KV channel per pair of stages: a lease, a push and a release round trip; a
// route text too long, a lying payload size, a push of no tokens are refused by name.
TEST(stage_frame, pair_frames_round_trip_and_lying_ones_are_refused) {
  stage_frame_limits limits;
  const auto payload_of = [](const std::vector<std::byte>& frame) {
    return std::span(frame).subspan(stage_frame_header_bytes);
  };
  kv_stage_lease lease{
      7, 42, 10, {9, 5, 12}, std::chrono::milliseconds(2500), "tcp://10.0.0.2:4711", std::string(40, 'k')};
  std::vector<std::byte> frame;
  encode_stage_kv_lease(3, lease, 5, frame);
  stage_frame_header h = header_of(frame, limits);
  EXPECT_EQ(h.kind, stage_frame_kind::kv_lease);
  EXPECT_EQ(h.step_id, 3u);
  const kv_stage_lease lease_back = decode_stage_kv_lease(h, payload_of(frame));
  EXPECT_EQ(lease_back.transfer_id, 7u);
  EXPECT_EQ(lease_back.request_id, 42);
  EXPECT_EQ(lease_back.num_tokens, 10);
  EXPECT_EQ(lease_back.block_ids, lease.block_ids);
  EXPECT_EQ(lease_back.timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(lease_back.relay_endpoint, lease.relay_endpoint);
  EXPECT_EQ(lease_back.relay_public_key, lease.relay_public_key);

  kv_stage_push push;
  push.transfer_id = 7;
  push.request_id = 42;
  push.token_begin = 4;
  push.token_end = 10;
  push.span = kv_span_for(model_config{}, kv_cache_shape{16, 4}, 2, 0, 2, dtype::f32);
  push.span.num_kv_heads = 2;
  push.span.head_dim = 8;
  push.block_ids = {1, 2};
  push.last = true;
  push.to = kv_stage_route{{0, 2}, "kvtcp://127.0.0.1:7112", ""};
  encode_stage_kv_push(4, push, frame);
  h = header_of(frame, limits);
  const kv_stage_push push_back = decode_stage_kv_push(h, payload_of(frame));
  EXPECT_EQ(push_back.token_begin, 4);
  EXPECT_EQ(push_back.token_end, 10);
  EXPECT_EQ(push_back.block_ids, push.block_ids);
  EXPECT_EQ(push_back.span.num_layers, 2);
  EXPECT_TRUE(push_back.last);
  EXPECT_EQ(push_back.to.layers, (layer_range{0, 2}));
  EXPECT_EQ(push_back.to.endpoint, push.to.endpoint);
  EXPECT_EQ(push_back.to.public_key, "");

  encode_stage_kv_release(5, 7, frame);
  EXPECT_EQ(decode_stage_kv_release(payload_of(frame)), 7u);

  // A route's text past its bound: refused from the header, before the payload is read.
  std::vector<std::byte> long_route;
  lease.relay_public_key = std::string(stage_route_max_bytes, 'k');
  EXPECT_NE(refusal([&] { encode_stage_kv_lease(3, lease, 5, long_route); }).find("at most 1024"), std::string::npos);
  encode_stage_kv_lease(3, kv_stage_lease{7, 42, 10, {9}, std::chrono::milliseconds(10), "tcp://h:1", ""}, 5, frame);
  stage_frame_header lying = header_of(frame, limits);
  lying.payload_bytes = stage_lease_fixed_bytes + 4 + stage_route_max_bytes + 1;
  std::array<std::byte, stage_frame_header_bytes> lying_head{};
  encode_stage_frame_header(lying, lying_head);
  EXPECT_NE(refusal([&] { decode_stage_frame_header(lying_head, limits); }).find("route text bytes"),
            std::string::npos);
  lying.payload_bytes = 3;  // less than its fixed fields and ids
  encode_stage_frame_header(lying, lying_head);
  EXPECT_NE(refusal([&] { decode_stage_frame_header(lying_head, limits); }).find("its KV request alone takes"),
            std::string::npos);
  // A push of no tokens, a lease of none, a route that is not three lines.
  push.token_end = push.token_begin;
  encode_stage_kv_push(4, push, frame);
  EXPECT_NE(refusal([&] { decode_stage_kv_push(header_of(frame, limits), payload_of(frame)); }).find("tokens [4, 4)"),
            std::string::npos);
  encode_stage_kv_lease(3, kv_stage_lease{7, 42, 0, {9}, std::chrono::milliseconds(10), "tcp://h:1", ""}, 5, frame);
  EXPECT_NE(refusal([&] { decode_stage_kv_lease(header_of(frame, limits), payload_of(frame)); }).find("of 0 tokens"),
            std::string::npos);
  EXPECT_NE(refusal([&] { (void)parse_kv_stage_route("0-1\nkvtcp://h:1"); }).find("three lines"), std::string::npos);
  EXPECT_NE(refusal([&] { (void)parse_kv_stage_route("0-1\nkvtcp://h 1\n"); }).find("printable"), std::string::npos);
}

TEST(stage_frame, inconsistent_arrays_are_refused_by_name) {
  auto refused = [](auto edit, int vocab = 100) {
    forward_batch b = sample_batch();
    edit(b);
    std::vector<std::byte> head;
    encode_work_frame(1, 0, b, 0, head);
    stage_frame_limits limits;
    const stage_frame_header h = header_of(head, limits);
    forward_batch out;
    return refusal([&] { decode_work_arrays(h, std::span(head).subspan(stage_frame_header_bytes), vocab, out); });
  };
  EXPECT_NE(refused([](forward_batch& b) {
              b.query_start = {0, 3, 3};
            }).find("query_start must run from 0 to 4"),
            std::string::npos);
  EXPECT_NE(refused([](forward_batch& b) {
              b.query_start = {0, 5, 4};
            }).find("query_start goes back"),
            std::string::npos);
  EXPECT_NE(refused([](forward_batch& b) {
              b.block_table_start = {0, 4, 3};
            }).find("block_table_start goes back"),
            std::string::npos);
  EXPECT_NE(refused([](forward_batch& b) { b.positions[1] = 5; }).find("position 5 outside its context of 5"),
            std::string::npos);
  EXPECT_NE(refused([](forward_batch& b) { b.positions[3] = -1; }).find("position -1"), std::string::npos);
  EXPECT_NE(refused([](forward_batch& b) { b.token_ids[0] = 100; }).find("token id 100 outside the vocabulary"),
            std::string::npos);
  EXPECT_EQ(refused([](forward_batch& b) { b.token_ids[0] = 100; }, 0), "");  // later stages do not embed
}

TEST(stage_frame, micro_batches_cut_whole_sequences_of_about_equal_tokens) {
  forward_batch b;
  b.query_start = {0, 10, 11, 12, 13, 23};  // two prefill chunks of 10 and three decodes
  b.token_ids.resize(23);
  b.context_lengths.resize(5);
  EXPECT_EQ(cut_micro_batches(b, 1), (std::vector<std::pair<int, int>>{{0, 5}}));
  EXPECT_EQ(cut_micro_batches(b, 2), (std::vector<std::pair<int, int>>{{0, 2}, {2, 5}}));
  const auto five = cut_micro_batches(b, 9);  // never more than the sequences
  EXPECT_EQ(five.size(), 5u);
  const forward_batch full = sample_batch();
  const forward_batch second = slice_sequences(full, 1, 2);
  EXPECT_EQ(second.token_ids, (std::vector<int32_t>{7}));
  EXPECT_EQ(second.query_start, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(second.block_table_start, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(second.block_tables, (std::vector<int32_t>{2}));
  EXPECT_EQ(second.context_lengths, (std::vector<int32_t>{2}));
}

}  // namespace
}  // namespace troupe
