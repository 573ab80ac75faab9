// The NaN/Inf check of float weights at load (model/weight_finiteness.hpp) on a real GGUF file:
// each scan width on one thread, and the widest on every thread, as the loader runs it. Each
// configuration maps the file afresh, so its first scan pays the first touch of every page (as
// a load does; the file itself is in the page cache after the first), then scans again resident.
//
//   troupe_bench_weight_scan --model FILE.gguf [--reps 3] [--threads N]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include "model/loader/gguf_file.hpp"
#include "model/loader/gguf_model_loader.hpp"
#include "model/weight_finiteness.hpp"

namespace {

using namespace troupe;

const char* width_name(finiteness_scan_width w) {
  switch (w) {
    case finiteness_scan_width::scalar: return "scalar";
    case finiteness_scan_width::avx2: return "avx2";
    case finiteness_scan_width::avx512: return "avx512";
  }
  return "?";
}

double seconds_of(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Best of `reps` fresh mappings: (first scan, resident scan) seconds.
std::pair<double, double> measure(const std::string& path, finiteness_scan_width width, unsigned threads, int reps) {
  double first = 1e9, resident = 1e9;
  for (int r = 0; r < reps; ++r) {
    gguf_file file = gguf_file::open(path);
    weight_store weights;
    load_gguf_weights(file, gguf_model_config(file), weights);
    first = std::min(first, seconds_of([&] { check_weights_finite(weights, path, threads, width); }));
    resident = std::min(resident, seconds_of([&] { check_weights_finite(weights, path, threads, width); }));
  }
  return {first, resident};
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  int reps = 3;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model")
      path = argv[i + 1];
    else if (flag == "--reps")
      reps = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--threads")
      threads = static_cast<unsigned>(std::max(1, std::atoi(argv[i + 1])));
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (path.empty()) {
    std::fprintf(stderr, "usage: troupe_bench_weight_scan --model FILE.gguf [--reps 3] [--threads N]\n");
    return 2;
  }
  try {
    gguf_file file = gguf_file::open(path);
    weight_store weights;
    load_gguf_weights(file, gguf_model_config(file), weights);
    const double gb = static_cast<double>(weights.total_bytes()) / 1e9;
    std::printf("%s: %.2f GB of weights, best of %d fresh mappings\n", path.c_str(), gb, reps);
    std::printf("%-8s %7s %16s %16s\n", "width", "threads", "first touch", "resident");
    auto row = [&](finiteness_scan_width w, unsigned n) {
      const auto [first, resident] = measure(path, w, n, reps);
      std::printf("%-8s %7u %8.3f s %4.1f GB/s %8.3f s %4.1f GB/s\n", width_name(w), n, first, gb / first, resident,
                  gb / resident);
    };
    for (finiteness_scan_width w : supported_finiteness_scan_widths()) row(w, 1);
    if (threads > 1) row(supported_finiteness_scan_widths().back(), threads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
