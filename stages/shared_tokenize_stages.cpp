#include "stages/shared_tokenize_stages.hpp"

namespace troupe {

std::shared_ptr<const tokenize_stage> shared_tokenize_stages::get(
    const std::string& key, const std::function<std::shared_ptr<const tokenize_stage>()>& make) {
  std::lock_guard lock(mutex_);
  if (auto it = stages_.find(key); it != stages_.end()) {
    if (auto live = it->second.lock()) return live;
  }
  // Forget the stages no actor holds any more, so keys of ended pools do not pile up.
  std::erase_if(stages_, [](const auto& entry) { return entry.second.expired(); });
  std::shared_ptr<const tokenize_stage> made = make();
  stages_[key] = made;
  return made;
}

}  // namespace troupe
