#include "text/stop_string_matcher.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "text/unicode/utf8.hpp"

namespace troupe {

namespace {

bool starts_character(char byte) { return !utf8::is_continuation_byte(static_cast<unsigned char>(byte)); }

}  // namespace

stop_string_matcher::stop_string_matcher(std::vector<std::string> stop_strings)
    : stop_strings_(std::move(stop_strings)) {
  for (size_t i = 0; i < stop_strings_.size(); ++i) {
    if (stop_strings_[i].empty()) {
      throw std::invalid_argument("stop string " + std::to_string(i) + " is empty");
    }
    max_stop_bytes_ = std::max(max_stop_bytes_, stop_strings_[i].size());
  }
}

stop_string_matcher::step stop_string_matcher::push(std::string_view text) {
  step out;
  if (matched()) return out;
  if (!active()) {
    out.text.assign(text);
    return out;
  }
  held_.append(text);
  if (const size_t start = find_first_match(); start != std::string::npos) {
    held_.resize(start);
    out.text = std::exchange(held_, {});
    out.matched = true;
    return out;
  }
  const size_t keep_from = start_of_possible_stop();
  out.text = held_.substr(0, keep_from);
  held_.erase(0, keep_from);
  return out;
}

std::string stop_string_matcher::finish() {
  if (matched()) return {};
  return std::exchange(held_, {});
}

size_t stop_string_matcher::find_first_match() {
  // held_ never holds a whole stop string between calls, so a match always ends in the new text;
  // searching the whole (short) buffer keeps this simple and obviously right.
  size_t best_start = std::string::npos;
  size_t best_end = std::string::npos;
  for (size_t i = 0; i < stop_strings_.size(); ++i) {
    const std::string& stop = stop_strings_[i];
    size_t start = held_.find(stop);
    while (start != std::string::npos && !starts_character(held_[start])) start = held_.find(stop, start + 1);
    if (start == std::string::npos) continue;
    const size_t end = start + stop.size();
    // Completes first; on a tie the longer one, which starts first.
    if (best_end == std::string::npos || end < best_end || (end == best_end && start < best_start)) {
      best_start = start;
      best_end = end;
      matched_index_ = static_cast<int>(i);
    }
  }
  return best_start;
}

size_t stop_string_matcher::start_of_possible_stop() const {
  // Only the last max_stop_bytes_ - 1 bytes can still begin a stop string that is not complete.
  const size_t size = held_.size();
  const size_t first = size >= max_stop_bytes_ ? size - max_stop_bytes_ + 1 : 0;
  for (size_t start = first; start < size; ++start) {
    if (!starts_character(held_[start])) continue;
    const size_t tail = size - start;
    for (const std::string& stop : stop_strings_) {
      if (stop.size() > tail && stop.compare(0, tail, held_, start, tail) == 0) return start;
    }
  }
  return size;
}

}  // namespace troupe
