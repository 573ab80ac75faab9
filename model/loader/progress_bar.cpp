#include "model/loader/progress_bar.hpp"

#include <unistd.h>

#include <cstdio>

#include <spdlog/spdlog.h>

namespace troupe {

progress_bar::progress_bar(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled && total > 0), tty_(::isatty(STDERR_FILENO) == 1) {}

progress_bar::~progress_bar() { finish(); }

void progress_bar::advance(uint64_t amount) {
  if (!enabled_ || finished_) return;
  done_ = std::min(total_, done_ + amount);
  draw();
}

void progress_bar::draw() {
  const int percent = static_cast<int>(100 * done_ / total_);
  if (tty_) {
    if (percent == last_percent_) return;
    last_percent_ = percent;
    constexpr int width = 40;
    const int filled = percent * width / 100;
    std::fprintf(stderr, "\r%s [%.*s%*s] %3d%%", label_.c_str(), filled, "########################################",
                 width - filled, "", percent);
    std::fflush(stderr);
  } else {
    const int quarter = percent / 25;
    if (quarter == last_quarter_) return;
    last_quarter_ = quarter;
    spdlog::info("{}: {}%", label_, quarter * 25);
  }
}

void progress_bar::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (tty_) std::fprintf(stderr, "\n");
}

}  // namespace troupe
