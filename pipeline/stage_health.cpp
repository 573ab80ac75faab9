#include "pipeline/stage_health.hpp"

namespace troupe {

stage_health_board& stage_health_board::instance() {
  static stage_health_board board;
  return board;
}

void stage_health_board::down(const std::string& key, const std::string& why) {
  std::lock_guard lock(mutex_);
  down_[key] = why;
}

void stage_health_board::up(const std::string& key) {
  std::lock_guard lock(mutex_);
  down_.erase(key);
}

std::string stage_health_board::down_text() const {
  std::lock_guard lock(mutex_);
  std::string text;
  for (const auto& [key, why] : down_) {
    if (!text.empty()) text += "; ";
    text += key + ": " + why;
  }
  return text;
}

}  // namespace troupe
