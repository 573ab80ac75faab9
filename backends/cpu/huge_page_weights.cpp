#include "backends/cpu/huge_page_weights.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "backends/cpu/matmul.hpp"
#include "backends/cpu/thread_pool.hpp"

namespace troupe::cpu {
namespace {

std::atomic<bool> copying{true};

// The repacked layouts are in huge pages already, or would be with repacking on: a benchmark
// that turns repacking off measures the file's own layout.
bool is_copied(const weight_view& w) {
  return w.data != nullptr && w.repacked == nullptr && !has_repacked_layout(w.type);
}

size_t bytes_of(const weight_view& w) { return row_bytes(w.type, w.cols) * static_cast<size_t>(w.rows); }

size_t aligned_64(size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

bool weights_in_huge_pages() { return copying.load(std::memory_order_relaxed); }
void set_weights_in_huge_pages(bool on) { copying.store(on, std::memory_order_relaxed); }

bool transparent_huge_pages_on_request() {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(file, modes);
  // The selected mode is the bracketed one: "always [madvise] never".
  return modes.find("[always]") != std::string::npos || modes.find("[madvise]") != std::string::npos;
}

huge_page_copy copy_weights_to_huge_pages(thread_pool& pool, const std::vector<weight_view*>& weights,
                                          const std::vector<bool>& owner_frees_anonymous) {
  huge_page_copy out;
  if (!weights_in_huge_pages() || !transparent_huge_pages_on_request()) return out;
  // Whether each view moves: a file's bytes always, anonymous bytes only where their owner frees them.
  std::vector<bool> moves(weights.size(), false);
  std::unordered_map<const std::byte*, size_t> offset_of_source;  // a tied matrix is copied once
  size_t total = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const weight_view* w = weights[i];
    if (!is_copied(*w)) continue;
    if (!in_file_mapping(w->data) && !(i < owner_frees_anonymous.size() && owner_frees_anonymous[i])) continue;
    moves[i] = true;
    if (offset_of_source.emplace(w->data, total).second) total += aligned_64(bytes_of(*w));
  }
  if (total == 0) return out;
  out.buffer = allocate_repacked(total);
  std::byte* const base = out.buffer.get();
  // 2 MiB pieces, so the pool's threads share a matrix and first-touch its huge pages in parallel.
  constexpr size_t piece = size_t{2} << 20;
  std::unordered_set<const std::byte*> copied;  // sources already copied
  for (size_t i = 0; i < weights.size(); ++i) {
    weight_view& w = *weights[i];
    if (!moves[i]) continue;
    std::byte* const destination = base + offset_of_source.at(w.data);
    const size_t bytes = bytes_of(w);
    if (copied.insert(w.data).second) {
      const std::byte* const source = w.data;
      const auto pieces = static_cast<int64_t>((bytes + piece - 1) / piece);
      pool.parallel_for(0, pieces, 1, [&](int64_t begin, int64_t end, int) {
        for (int64_t p = begin; p < end; ++p) {
          const size_t at = static_cast<size_t>(p) * piece;
          std::memcpy(destination + at, source + at, std::min(piece, bytes - at));
        }
      });
      if (in_file_mapping(source)) {
        release_source_pages(w);
      } else {
        out.from_anonymous.push_back(i);
      }
    }
    w.data = destination;
  }
  return out;
}

}  // namespace troupe::cpu
