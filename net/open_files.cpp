#include "net/open_files.hpp"

#include <sys/resource.h>

#include <algorithm>

namespace troupe {
namespace {

size_t as_size(rlim_t value, size_t ceiling) {
  if (value == RLIM_INFINITY) return ceiling;
  return static_cast<size_t>(std::min<rlim_t>(value, static_cast<rlim_t>(ceiling)));
}

}  // namespace

open_files_limit current_open_files_limit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return {};
  constexpr size_t unlimited = ~size_t{0};
  return {as_size(files.rlim_cur, unlimited), as_size(files.rlim_max, unlimited)};
}

open_files_raise raise_open_files_limit(size_t ceiling) {
  open_files_raise result;
  result.before = current_open_files_limit();
  result.after = result.before;
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return result;
  const rlim_t target = files.rlim_max == RLIM_INFINITY
                            ? static_cast<rlim_t>(ceiling)
                            : std::min<rlim_t>(files.rlim_max, static_cast<rlim_t>(ceiling));
  if (files.rlim_cur != RLIM_INFINITY && files.rlim_cur < target) {
    files.rlim_cur = target;
    if (::setrlimit(RLIMIT_NOFILE, &files) == 0) result.after = current_open_files_limit();
  }
  return result;
}

size_t door_connection_share(size_t soft_limit, size_t door_max) {
  return std::clamp<size_t>(soft_limit / 6, 16, std::max<size_t>(door_max, 16));
}

}  // namespace troupe
