// The NaN/Inf scan of float weights (model/weight_finiteness.hpp) at every width this CPU runs:
// each finds exactly the element the scalar loop finds, for a bad value in every vector lane, in
// every position of the tail past the last whole vector, and across chunk boundaries; -inf is
// allowed only where asked (attention sinks); and the threaded check reports the same first
// tensor and element as one thread.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "model/weight_finiteness.hpp"

namespace troupe {
namespace {

struct float_type {
  dtype type;
  size_t bytes;  // per element
  uint32_t one;  // 1.0
  uint32_t nan, pos_inf, neg_inf;
  uint32_t largest_finite;  // all exponent bits but one set
};

const std::vector<float_type>& float_types() {
  static const std::vector<float_type> types = {
      {dtype::f32, 4, 0x3f800000u, 0x7fc00001u, 0x7f800000u, 0xff800000u, 0x7f7fffffu},
      {dtype::f16, 2, 0x3c00u, 0x7e01u, 0x7c00u, 0xfc00u, 0x7bffu},
      {dtype::bf16, 2, 0x3f80u, 0x7fc1u, 0x7f80u, 0xff80u, 0x7f7fu},
  };
  return types;
}

// A buffer of `count` elements of `t`, each 1.0, with raw element access.
class elements {
 public:
  elements(const float_type& t, int64_t count)
      : t_(t), count_(count), bytes_(static_cast<size_t>(count) * t.bytes + 64) {
    for (int64_t i = 0; i < count; ++i) set(i, t.one);
  }
  void set(int64_t i, uint32_t bits) {
    // Offset by one element from the allocation's start: the scan must not need alignment.
    std::memcpy(bytes_.data() + t_.bytes * (static_cast<size_t>(i) + 1), &bits, t_.bytes);  // little endian
  }
  weight_tensor tensor() const {
    weight_tensor w;
    w.type = t_.type;
    w.shape = {count_};
    w.data = bytes_.data() + t_.bytes;
    w.num_bytes = static_cast<size_t>(count_) * t_.bytes;
    return w;
  }

 private:
  float_type t_;
  int64_t count_;
  std::vector<std::byte> bytes_;
};

std::string name_of(finiteness_scan_width w) {
  return w == finiteness_scan_width::scalar ? "scalar" : w == finiteness_scan_width::avx2 ? "avx2" : "avx512";
}

TEST(weight_finiteness, every_width_finds_a_bad_value_in_every_lane_and_tail_position) {
  // 64-byte vectors hold 16 f32 or 32 16-bit elements; the widest step is four of them. Sizes
  // around those, so that every lane of a whole vector and every tail position is tried.
  for (const float_type& t : float_types()) {
    for (finiteness_scan_width w : supported_finiteness_scan_widths()) {
      for (int64_t count : {1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257}) {
        for (int64_t at = 0; at < count; ++at) {
          for (uint32_t bad : {t.nan, t.pos_inf, t.neg_inf}) {
            elements e(t, count);
            e.set(at, t.largest_finite);  // finite neighbours that share most exponent bits
            if (at + 1 < count) e.set(at + 1, t.largest_finite);
            EXPECT_FALSE(first_non_finite(e.tensor(), false, w))
                << name_of(w) << " " << dtype_name(t.type) << " count " << count << " at " << at;
            e.set(at, bad);
            EXPECT_EQ(first_non_finite(e.tensor(), false, w), at)
                << name_of(w) << " " << dtype_name(t.type) << " count " << count << " bits " << std::hex << bad;
            // -inf allowed (a sink): only NaN and +inf are found.
            const std::optional<int64_t> expected = bad == t.neg_inf ? std::nullopt : std::optional<int64_t>(at);
            EXPECT_EQ(first_non_finite(e.tensor(), true, w), expected)
                << name_of(w) << " " << dtype_name(t.type) << " count " << count << " at " << at;
          }
        }
      }
    }
  }
}

TEST(weight_finiteness, every_width_finds_the_first_across_chunks_and_after_allowed_negative_infinities) {
  for (const float_type& t : float_types()) {
    for (finiteness_scan_width w : supported_finiteness_scan_widths()) {
      const int64_t count = 100003;  // several chunks and a ragged end
      elements e(t, count);
      e.set(count - 1, t.nan);
      EXPECT_EQ(first_non_finite(e.tensor(), false, w), count - 1) << name_of(w);
      e.set(40000, t.neg_inf);  // allowed where asked: the chunk is searched, the scan goes on
      EXPECT_EQ(first_non_finite(e.tensor(), true, w), count - 1) << name_of(w);
      EXPECT_EQ(first_non_finite(e.tensor(), false, w), 40000) << name_of(w);
      e.set(16383, t.pos_inf);  // the last element of the first chunk
      EXPECT_EQ(first_non_finite(e.tensor(), true, w), 16383) << name_of(w);
    }
  }
}

TEST(weight_finiteness, every_width_agrees_with_the_scalar_scan_on_random_bits) {
  std::mt19937_64 rng(25);
  for (const float_type& t : float_types()) {
    for (int trial = 0; trial < 40; ++trial) {
      const int64_t count = 1 + static_cast<int64_t>(rng() % 70000);
      elements e(t, count);
      // Random bits, mostly finite: an all-ones exponent in about one element of 2^(exponent bits)
      // of each random pattern, then a few planted ones (or none).
      for (int64_t i = 0; i < count; ++i) {
        uint32_t bits = static_cast<uint32_t>(rng());
        if (t.bytes == 2) bits &= 0xffffu;
        if (rng() % 64 != 0) bits &= ~(t.pos_inf & ~(t.pos_inf >> 1));  // clear the exponent's top bit: finite
        e.set(i, bits);
      }
      const int planted = static_cast<int>(rng() % 3);
      for (int p = 0; p < planted; ++p) e.set(static_cast<int64_t>(rng() % static_cast<uint64_t>(count)), t.neg_inf);
      for (bool allow : {false, true}) {
        const std::optional<int64_t> scalar = first_non_finite(e.tensor(), allow, finiteness_scan_width::scalar);
        for (finiteness_scan_width w : supported_finiteness_scan_widths()) {
          EXPECT_EQ(first_non_finite(e.tensor(), allow, w), scalar)
              << name_of(w) << " " << dtype_name(t.type) << " trial " << trial << " allow " << allow;
        }
      }
    }
  }
}

TEST(weight_finiteness, the_threaded_check_reports_the_first_bad_tensor_in_name_order) {
  // 40 tensors of 2 MiB each (over the threaded scan's 64 MiB threshold); bad values in tensors
  // 7 and 31 and a -inf in a sink. Every thread count names tensor 07, element 12345.
  const float_type& t = float_types()[1];
  std::vector<elements> buffers;
  buffers.reserve(41);
  weight_store store;
  for (int i = 0; i < 40; ++i) {
    buffers.emplace_back(t, int64_t(1) << 20);
    if (i == 7) buffers.back().set(12345, t.nan);
    if (i == 31) buffers.back().set(5, t.pos_inf);
    weight_tensor w = buffers.back().tensor();
    w.shape = {1024, 1024};
    w.name = "layers." + std::string(i < 10 ? "0" : "") + std::to_string(i) + ".weight";
    store.add(std::move(w));
  }
  buffers.emplace_back(t, 8);
  buffers.back().set(3, t.neg_inf);
  weight_tensor sinks = buffers.back().tensor();
  sinks.name = "layers.00.attn.sinks";
  store.add(std::move(sinks));
  for (unsigned threads : {1u, 2u, 5u, 16u}) {
    try {
      check_weights_finite(store, "the test", threads);
      ADD_FAILURE() << threads << " threads found nothing";
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("tensor layers.07.weight of the test"), std::string::npos) << threads << ": " << what;
      EXPECT_NE(what.find("element 12345 (row 12, column 57)"), std::string::npos) << threads << ": " << what;
    }
  }
  weight_store clean;
  weight_tensor sink_only = buffers.back().tensor();
  sink_only.name = "layers.00.attn.sinks";
  clean.add(std::move(sink_only));
  EXPECT_NO_THROW(check_weights_finite(clean, "the test"));
}

}  // namespace
}  // namespace troupe
