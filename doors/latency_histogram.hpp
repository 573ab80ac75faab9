#pragma once
// A Prometheus histogram of seconds (or of any value: speculative decoding's tokens per step use
// it too): fixed upper bounds, a count per bucket, the sum and the count of every observation.
// Plain value; whoever shares one guards it (serving_metrics does).

#include <algorithm>
#include <cstdint>
#include <vector>

namespace troupe {

class latency_histogram {
 public:
  // `upper_bounds` ascending; the +Inf bucket is implied.
  explicit latency_histogram(std::vector<double> upper_bounds)
      : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

  void observe(double seconds) {
    // Prometheus' `le`: an observation equal to a bound falls in that bound's bucket.
    const auto it = std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), seconds);
    ++counts_[static_cast<size_t>(it - upper_bounds_.begin())];
    sum_ += seconds;
    ++count_;
  }

  const std::vector<double>& upper_bounds() const { return upper_bounds_; }
  // Per bucket, not cumulative: [upper_bounds().size() + 1], the last one +Inf's own.
  const std::vector<uint64_t>& bucket_counts() const { return counts_; }
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> upper_bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

}  // namespace troupe
