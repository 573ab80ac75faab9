#include "doors/request_trace_log.hpp"

#include <algorithm>

namespace troupe {

void request_trace_log::add(request_record record) {
  std::lock_guard lock(mutex_);
  records_.push_back(std::move(record));
  while (records_.size() > capacity_) records_.pop_front();
}

std::vector<request_record> request_trace_log::finished_since(timestamp_ns since) const {
  std::lock_guard lock(mutex_);
  auto first =
      std::find_if(records_.begin(), records_.end(), [&](const request_record& r) { return r.finish >= since; });
  return {first, records_.end()};
}

}  // namespace troupe
