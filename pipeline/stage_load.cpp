#include "pipeline/stage_load.hpp"

#include <algorithm>
#include <cstdio>

namespace troupe {

stage_load_board& stage_load_board::instance() {
  static stage_load_board board;
  return board;
}

void stage_load_board::prune(stage& s, clock::time_point now) {
  while (!s.recent.empty() && s.recent.front().first <= now - window) s.recent.pop_front();
}

void stage_load_board::add(layer_range layers, const std::string& where, std::chrono::nanoseconds busy,
                           clock::time_point now) {
  std::lock_guard lock(mutex_);
  auto [it, fresh] = stages_.try_emplace(key{layers.first, where});
  if (fresh) {
    it->second.first = layers;
    it->second.second.first_seen = now;
  }
  stage& s = it->second.second;
  s.recent.emplace_back(now, busy);
  prune(s, now);
}

void stage_load_board::forget(layer_range layers, const std::string& where) {
  std::lock_guard lock(mutex_);
  stages_.erase(key{layers.first, where});
  processes_.erase(key{layers.first, where});
}

void stage_load_board::report_cpu(layer_range layers, const std::string& where, stage_process_cpu cpu) {
  std::lock_guard lock(mutex_);
  processes_[key{layers.first, where}] = std::move(cpu);
}

std::vector<stage_process_cpu> stage_load_board::processes() const {
  std::lock_guard lock(mutex_);
  std::vector<stage_process_cpu> out;
  for (const auto& [k, cpu] : processes_) out.push_back(cpu);
  return out;
}

std::string stage_process_identity(const std::string& endpoint, uint32_t pid) {
  const size_t scheme = endpoint.find("://");
  const size_t begin = scheme == std::string::npos ? 0 : scheme + 3;
  const size_t colon = endpoint.find(':', begin);
  const std::string host = endpoint.substr(begin, colon == std::string::npos ? std::string::npos : colon - begin);
  return host + ":" + std::to_string(pid);
}

std::vector<stage_busy> stage_load_board::shares(clock::time_point now) const {
  std::lock_guard lock(mutex_);
  std::vector<stage_busy> out;
  for (const auto& [k, entry] : stages_) {
    const stage& s = entry.second;
    std::chrono::nanoseconds busy{0};
    for (const auto& [at, ns] : s.recent) {
      if (at > now - window) busy += ns;
    }
    // A stage seen for less than the window is judged over the time since (at least a second:
    // one step is no share).
    const auto seen = std::max<clock::duration>(now - s.first_seen, std::chrono::seconds(1));
    const auto span = std::min<clock::duration>(seen, window);
    const double share = std::chrono::duration<double>(busy).count() / std::chrono::duration<double>(span).count();
    out.push_back(stage_busy{entry.first, k.second, std::clamp(share, 0.0, 1.0)});
  }
  return out;
}

std::string stage_busy_text(const std::vector<stage_busy>& stages) {
  std::string text;
  for (const stage_busy& s : stages) {
    if (!text.empty()) text += ',';
    char share[16];
    std::snprintf(share, sizeof share, "%.1f%%", s.busy_share * 100);
    text += layer_range_text(s.layers) + ":" + share;
  }
  return text;
}

}  // namespace troupe
