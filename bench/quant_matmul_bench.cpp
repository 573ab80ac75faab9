// The CPU matmul of every weight type against this machine's memory roof, in one run:
//  1. DRAM read bandwidth: every thread streams its share of a buffer far larger than the
//     last-level cache (best of --reps passes);
//  2. per type, y = x · wᵀ at --shape (out x in; default 4096x14336, a Llama-8B down_proj) for each
//     of --rows activation rows: the step's time, and for one row the weights' effective read
//     bandwidth (weight bytes / time) as a fraction of (1); quantized types also through the f32
//     path they took before the integer kernels (to_f32 + row dots / per-thread slabs + sgemm),
//     float types also with the previous switch to slabs + sgemm at 8 rows ("@8");
//  3. per type, a prompt's product (--prompt rows at --prompt-shape): integer kernels against
//     f32 slabs + OpenBLAS sgemm, in GFLOP/s.
// Weights are random blocks (finite scales); speed does not depend on their values.
// --clock cpu times by the process's CPU time divided by the threads instead of the wall clock:
// on a shared, oversubscribed machine a thread taken off its core stops that clock, so the figures
// say what the code does when it runs (a parallel step's threads are all busy until it ends).
//
//   troupe_bench_quant [--types all|q4_0,q8_0,...] [--shape 4096x14336] [--rows 1,8,32,64]
//                      [--prompt 512] [--prompt-shape 4096x4096] [--threads N] [--reps 5]
//                      [--baseline on|off] [--probe-mib 512] [--clock wall|cpu]
//                      [--simd scalar|avx2|avx512|avx512_vnni]
// --simd runs the kernels of a lower level than the CPU's (the AVX2 path on an AVX-512 machine).

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/blas_core.hpp"
#include "backends/cpu/matmul.hpp"
#include "backends/cpu/row_kernels.hpp"
#include "backends/cpu/simd_level.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "bench/bench_support.hpp"
#include "model/half_float.hpp"

namespace {

using troupe::dtype;

// Seconds on the chosen clock: wall, or the process's CPU time per pool thread.
bool cpu_clock = false;
int clock_threads = 1;
double now_seconds() {
  if (!cpu_clock) return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (t.tv_sec + t.tv_nsec * 1e-9) / clock_threads;
}

// Best time of `reps` runs of fn after one warm-up run.
template <class Fn>
double best_seconds(int reps, Fn&& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double start = now_seconds();
    fn();
    best = std::min(best, now_seconds() - start);
  }
  return best;
}

// GB/s of every pool thread summing its share of a buffer of `mib` MiB.
double dram_read_gbps(troupe::cpu::thread_pool& pool, int64_t mib, int reps) {
  const int64_t words = mib * (1 << 20) / 8;
  std::vector<uint64_t> buffer(static_cast<size_t>(words));
  pool.parallel_for(0, words, words / pool.num_threads() + 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) buffer[i] = static_cast<uint64_t>(i);
  });
  std::vector<uint64_t> sums(pool.num_threads() * 8);
  const double seconds = best_seconds(reps, [&] {
    pool.parallel_for(0, words, words / pool.num_threads() + 1, [&](int64_t begin, int64_t end, int thread) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t i = begin;
      for (; i + 4 <= end; i += 4) {
        s0 += buffer[i];
        s1 += buffer[i + 1];
        s2 += buffer[i + 2];
        s3 += buffer[i + 3];
      }
      for (; i < end; ++i) s0 += buffer[i];
      sums[thread * 8] = s0 + s1 + s2 + s3;
    });
  });
  return static_cast<double>(words) * 8 / seconds / 1e9;
}

// Random bytes with every block's scales finite and moderate (as tests/backends do).
std::vector<std::byte> random_weights(dtype type, int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<std::byte> bytes(troupe::row_bytes(type, cols) * rows);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(bytes.data() + i, &v, 8);
  }
  const auto& traits = troupe::dtype_traits_of(type);
  auto set_f16 = [&](size_t at, float value) {
    const uint16_t bits = troupe::f32_to_f16(value);
    std::memcpy(bytes.data() + at, &bits, 2);
  };
  if (type == dtype::f16 || type == dtype::bf16) {
    for (size_t i = 0; i + 2 <= bytes.size(); i += 2) {
      const float v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-5f;
      const uint16_t bits = type == dtype::f16 ? troupe::f32_to_f16(v) : troupe::f32_to_bf16(v);
      std::memcpy(bytes.data() + i, &bits, 2);
    }
    return bytes;
  }
  for (size_t at = 0; at < bytes.size(); at += traits.block_bytes) {
    switch (type) {
      case dtype::q4_1:
      case dtype::q5_1:
      case dtype::q4_k:
      case dtype::q5_k:
        set_f16(at, 0.01f);
        set_f16(at + 2, 0.005f);
        break;
      case dtype::q2_k:
        set_f16(at + 80, 0.01f);
        set_f16(at + 82, 0.005f);
        break;
      case dtype::q3_k: set_f16(at + 108, 0.01f); break;
      case dtype::q6_k: set_f16(at + 208, 0.01f); break;
      case dtype::mxfp4: bytes[at] = std::byte{120}; break;
      default: set_f16(at, 0.01f); break;
    }
  }
  return bytes;
}

std::pair<int64_t, int64_t> parse_shape(const std::string& text) {
  const size_t x = text.find('x');
  if (x == std::string::npos) throw std::runtime_error("shape '" + text + "' is not OUTxIN");
  return {std::stoll(text.substr(0, x)), std::stoll(text.substr(x + 1))};
}

std::vector<dtype> parse_types(const std::string& text) {
  std::vector<dtype> types;
  if (text == "all") {
    for (const char* name : {"f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k",
                             "q6_k", "iq4_nl", "iq4_xs", "mxfp4"})
      types.push_back(*troupe::dtype_from_name(name));
    return types;
  }
  std::string item;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ',') {
      const auto type = troupe::dtype_from_name(item);
      if (!type) throw std::runtime_error("unknown type '" + item + "'");
      types.push_back(*type);
      item.clear();
    } else {
      item += text[i];
    }
  }
  return types;
}

}  // namespace

int main(int argc, char** argv) try {
  troupe::cpu::restart_with_blas_settings(argv);  // backends/cpu/blas_core.hpp
  std::string types_arg = "all", shape_arg = "4096x14336", rows_arg = "1,8,32,64", prompt_shape_arg = "4096x4096";
  int threads = 0, reps = 5, prompt = 512, probe_mib = 512;
  bool baseline = true;
  std::string simd_arg;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::runtime_error("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--types")
      types_arg = value;
    else if (flag == "--shape")
      shape_arg = value;
    else if (flag == "--rows")
      rows_arg = value;
    else if (flag == "--prompt")
      prompt = std::stoi(value);
    else if (flag == "--prompt-shape")
      prompt_shape_arg = value;
    else if (flag == "--threads")
      threads = std::stoi(value);
    else if (flag == "--reps")
      reps = std::stoi(value);
    else if (flag == "--baseline")
      baseline = value == "on";
    else if (flag == "--probe-mib")
      probe_mib = std::stoi(value);
    else if (flag == "--clock")
      cpu_clock = value == "cpu";
    else if (flag == "--simd")
      simd_arg = value;
    else
      throw std::runtime_error("unknown flag " + flag);
  }
  if (!simd_arg.empty()) {
    bool known = false;
    for (auto level : {troupe::cpu::simd_level::scalar, troupe::cpu::simd_level::avx2, troupe::cpu::simd_level::avx512,
                       troupe::cpu::simd_level::avx512_vnni}) {
      if (troupe::cpu::simd_level_name(level) != simd_arg) continue;
      troupe::cpu::force_simd_level(level);  // throws naming a level this CPU cannot run
      known = true;
    }
    if (!known) throw std::runtime_error("--simd " + simd_arg + ": expected scalar, avx2, avx512 or avx512_vnni");
  }
  if (threads <= 0) threads = troupe::cpu::hardware_threads();
  const auto [m, k] = parse_shape(shape_arg);
  const auto [pm, pk] = parse_shape(prompt_shape_arg);
  const std::vector<int> row_counts = troupe::bench::parse_list(rows_arg);
  troupe::cpu::thread_pool pool(threads);
  clock_threads = threads;

  std::printf("threads %d, SIMD level %s, %s clock, load average %.2f\n", threads,
              std::string(troupe::cpu::simd_level_name(troupe::cpu::active_simd_level())).c_str(),
              cpu_clock ? "cpu" : "wall", troupe::bench::load_average());
  const double roof = dram_read_gbps(pool, probe_mib, reps);
  std::printf("DRAM read: %.2f GB/s (%d threads streaming %d MiB)\n\n", roof, threads, probe_mib);

  std::vector<float> scratch;
  const int gemm_min_rows = troupe::cpu::matmul_gemm_min_rows();
  // integer: quantized weights through the integer kernels, float weights through the row dots
  // at every count; else the f32 path, and float weights with the previous switch point (8 rows)
  // and without the 16-bit panel kernels. panels: 16-bit float weights as served by default
  // (row dots below matmul_gemm_min_rows, the panel kernels from there).
  auto step_seconds = [&](const troupe::cpu::weight_view& w, int64_t n, bool integer, bool panels = false) {
    const std::vector<float> x = [&] {
      std::vector<float> v(static_cast<size_t>(n * w.cols));
      std::mt19937 rng(7);
      std::normal_distribution<float> normal;
      for (float& f : v) f = normal(rng);
      return v;
    }();
    std::vector<float> y(static_cast<size_t>(n * w.rows));
    troupe::cpu::set_matmul_integer_kernels(integer || panels);
    troupe::cpu::set_matmul_float_rows_at_every_count(integer && !panels);
    troupe::cpu::set_matmul_float_panels(panels);
    if (!integer && !panels) troupe::cpu::set_matmul_gemm_min_rows(8);
    const double s = best_seconds(reps, [&] { troupe::cpu::matmul(pool, x.data(), n, w, y.data(), scratch); });
    troupe::cpu::set_matmul_integer_kernels(true);
    troupe::cpu::set_matmul_float_rows_at_every_count(true);
    troupe::cpu::set_matmul_float_panels(true);
    troupe::cpu::set_matmul_gemm_min_rows(gemm_min_rows);
    return s;
  };

  std::printf("step time of y = x . w^T, w %lldx%lld; GEMV bandwidth = weight bytes / time at 1 row\n",
              static_cast<long long>(m), static_cast<long long>(k));
  std::printf("%-8s %9s", "type", "MiB");
  for (int n : row_counts) std::printf(" %9s", (std::to_string(n) + " rows").c_str());
  std::printf(" %10s %8s\n", "GEMV GB/s", "of roof");
  for (dtype type : parse_types(types_arg)) {
    const std::vector<std::byte> bytes = random_weights(type, m, k, 1);
    const troupe::cpu::weight_view w{type, m, k, bytes.data()};
    const bool quantized = troupe::is_quantized(type);
    for (int pass = 0; pass < (baseline ? 2 : 1); ++pass) {
      const bool integer = pass == 0;
      std::printf("%-8s %9.1f",
                  (std::string(troupe::dtype_name(type)) + (integer     ? ""
                                                            : quantized ? " f32"
                                                                        : " @8"))
                      .c_str(),
                  bytes.size() / 1048576.0);
      double gemv = 0;
      for (int n : row_counts) {
        const double s = step_seconds(w, n, integer);
        if (n == 1) gemv = bytes.size() / s / 1e9;
        std::printf(" %7.2fms", s * 1e3);
        std::fflush(stdout);
      }
      if (gemv > 0) std::printf(" %10.2f %7.0f%%", gemv, 100 * gemv / roof);
      std::printf("\n");
    }
  }

  if (prompt > 0) {
    std::printf(
        "\nprompt: %d rows x w %lldx%lld, GFLOP/s (integer kernels, or float row dots / f32 slabs + sgemm;\n"
        "f16, bf16 and fp8_e4m3 also through the panel kernels, as served, and their ratio to slabs + sgemm)\n",
        prompt, static_cast<long long>(pm), static_cast<long long>(pk));
    for (dtype type : parse_types(types_arg)) {
      const std::vector<std::byte> bytes = random_weights(type, pm, pk, 2);
      const troupe::cpu::weight_view w{type, pm, pk, bytes.data()};
      const double flops = 2.0 * prompt * pm * pk;
      const double integer = flops / step_seconds(w, prompt, true) / 1e9;
      const double f32 = baseline ? flops / step_seconds(w, prompt, false) / 1e9 : 0;
      std::printf("%-8s %8.1f %8.1f  %.2fx", std::string(troupe::dtype_name(type)).c_str(), integer, f32,
                  f32 > 0 ? integer / f32 : 0.0);
      if (troupe::cpu::panel_weight_type(type)) {
        const double panels = flops / step_seconds(w, prompt, false, true) / 1e9;
        std::printf("  panels %8.1f  %.2fx", panels, f32 > 0 ? panels / f32 : 0.0);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  std::printf("\nload average at the end %.2f\n", troupe::bench::load_average());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "troupe_bench_quant: %s\n", e.what());
  return 1;
}
