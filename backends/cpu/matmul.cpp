#include "backends/cpu/matmul.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>

#include "backends/cpu/quant_kernels.hpp"
#include "backends/cpu/quant_repack.hpp"
#include "backends/cpu/row_kernels.hpp"
#include "model/weight_values.hpp"

namespace troupe::cpu {

namespace {

// The row dots tile two weight rows against up to four activation rows, which beats per-thread
// slabs + sgemm (their conversion and packing per call) up to about this many rows; from there
// sgemm's own blocking wins (troupe_bench_quant, f16/bf16/f32 at 8/32/64 rows).
std::atomic<int> gemm_min_rows{32};
std::atomic<bool> integer_kernels{true};
std::atomic<bool> float_rows_at_every_count{false};
std::atomic<bool> float_panels{true};

// Float weights at many activation rows through the row dots (float_rows_at_every_count): a
// thread takes this many weight rows at a time (256 KiB of f16 at k = 2048, kept in L2 while
// every block of activations passes over them) ...
constexpr int64_t float_chunk_rows = 64;
// ... and the activations go in blocks of about this many floats (128 KiB, in L2 beside them).
constexpr int64_t float_activation_block_floats = int64_t{32} << 10;

// Quantized weights: below this many activation rows a step streams memory (equal static shares
// of the weight rows per thread); from it on it computes (dynamic chunks).
constexpr int64_t few_rows = 8;

// Row-streaming path: a chunk of weight rows goes to a thread only with this many multiply-adds.
constexpr int64_t min_macs_per_chunk = 64 * 1024;

// Prefill path: converted weight slabs are at most this many floats (64 MiB), so that a large
// vocabulary's lm_head never needs a full f32 copy.
constexpr int64_t max_slab_floats = int64_t{16} << 20;

// Below this many activation rows (and from matmul_gemm_min_rows on), each pool thread runs a
// single-threaded sgemm per slab of weight rows; a non-f32 slab is converted into about 256 KiB
// of f32, which stays in a core's L2.
constexpr int64_t max_rows_for_cached_slabs = 128;
constexpr int64_t cached_slab_floats = int64_t{64} << 10;

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

void set_blas_threads(int num_threads) {
  if (openblas_get_num_threads() != num_threads) openblas_set_num_threads(num_threads);
}

// Quantized weights, any number of activation rows: the activations are quantized to int8 once,
// then every thread multiplies its tiles of weight rows (quant_kernels.hpp). The weight rows are
// split in multiples of 16 (a tile on every level), statically for a few activation rows (equal
// shares of memory traffic), in smaller dynamic chunks for many (compute: whoever is free).
void quantized_matmul(thread_pool& pool, const quant_kernels& kernels, const float* x, int64_t n, const weight_view& w,
                      float* y, std::vector<float>& scratch) {
  const int64_t m = w.rows;
  const int64_t k = w.cols;
  if (k % dtype_block_size(w.type) != 0) {
    throw std::runtime_error(std::string(dtype_name(w.type)) + " weight with " + std::to_string(k) +
                             " columns, expected a multiple of its block of " +
                             std::to_string(dtype_block_size(w.type)));
  }
  const size_t stride = row_bytes(w.type, k);
  const int threads = pool.num_threads();
  const size_t act_bytes = static_cast<size_t>(n * (k / 32)) * sizeof(act_block);
  const size_t per_thread = (kernels.scratch_bytes(n, k) + 63) / 64 * 64;
  const size_t total = act_bytes + per_thread * threads + 64;
  if (scratch.size() * sizeof(float) < total) scratch.resize((total + sizeof(float) - 1) / sizeof(float));
  std::byte* base = reinterpret_cast<std::byte*>(scratch.data());
  act_block* acts = reinterpret_cast<act_block*>(base);           // [n, k / 32]
  std::byte* thread_scratch = base + (act_bytes + 63) / 64 * 64;  // [threads][per_thread]

  const quantize_acts_fn quantize = kernels.quantize_acts[static_cast<int>(w.type)];
  const auto quantize_rows = [&](int64_t begin, int64_t end, int) {
    for (int64_t j = begin; j < end; ++j) quantize(x + j * k, k, acts + j * (k / 32));
  };
  if (n * k < min_macs_per_chunk) {
    quantize_rows(0, n, 0);
  } else {
    pool.parallel_for(0, n, 1, quantize_rows);
  }

  const quant_matmul_fn repacked_multiply = kernels.matmul_repacked[static_cast<int>(w.type)];
  const bool use_repacked =
      w.repacked != nullptr && repacked_multiply != nullptr && w.repack_rows == kernels.repack_rows;
  const quant_matmul_fn multiply = use_repacked ? repacked_multiply : kernels.matmul[static_cast<int>(w.type)];
  // Repacked: row `begin` (a multiple of 16, so of the tile's rows) starts tile begin / R.
  const size_t tile_bytes = use_repacked ? repacked_tile_bytes(w.type, k, w.repack_rows) : 0;
  const auto multiply_rows = [&](int64_t begin, int64_t end, int thread_index) {
    const std::byte* rows = use_repacked ? w.repacked + (begin / w.repack_rows) * tile_bytes : w.data + begin * stride;
    multiply(rows, k, end - begin, acts, n, y + begin, m, thread_scratch + per_thread * thread_index);
  };
  constexpr int64_t tile = 16;
  // Every chunk starts at a multiple of the tile (repacked weights are addressed by tile).
  const int64_t min_rows =
      (std::max<int64_t>(tile, min_macs_per_chunk / std::max<int64_t>(1, n * k)) + tile - 1) / tile * tile;
  const int64_t per_thread_rows = (m + threads - 1) / threads;
  if (n < few_rows) {
    pool.parallel_for(0, m, std::max(min_rows, (per_thread_rows + tile - 1) / tile * tile), multiply_rows);
  } else {
    const int64_t chunk = std::max(min_rows, (per_thread_rows / 4 + tile - 1) / tile * tile);
    pool.parallel_for_dynamic(0, m, chunk, multiply_rows);
  }
}

// Below this many outputs the row scales are applied on the calling thread.
constexpr int64_t min_outputs_per_scale_task = int64_t{1} << 16;

void matmul_stored(thread_pool& pool, const float* x, int64_t n, const weight_view& w, float* y,
                   std::vector<float>& scratch);

// Narrow float weights at many activation rows (row_kernels.hpp, panel_gemm_fn): the
// activations are transposed once, then each thread multiplies its weight rows a few at a time,
// converted into its cache, so the weight is never written out as f32 nor repacked. Below the
// level's panel_max_rows: from there OpenBLAS's sgemm over the converted weight is ahead (on
// AVX-512 0.8-0.9x for the panels at 512 and 1,024 rows, 1.0-1.9x at 256; docs/benchmarks.md),
// and the transposed copy stays small.

void panel_matmul(thread_pool& pool, const row_kernels& kernels, const float* x, int64_t n, const weight_view& w,
                  float* y, std::vector<float>& scratch) {
  const int64_t m = w.rows;
  const int64_t k = w.cols;
  const size_t stride = row_bytes(w.type, k);
  const int64_t tile = kernels.panel_tile_rows;
  const int64_t num_tiles = (n + tile - 1) / tile;
  const size_t packed = static_cast<size_t>(num_tiles * tile * k);
  const int64_t per_thread_rows = (m + pool.num_threads() - 1) / pool.num_threads();
  // At most 128 weight rows a chunk: their partial sums (128 x n floats) stay in L2 beside the
  // activations' chunk.
  const int64_t chunk = std::clamp<int64_t>(per_thread_rows / 4 / 16 * 16, 16, 128);
  const size_t per_thread = kernels.panel_scratch_floats(k, n, chunk);
  if (scratch.size() < packed + per_thread * pool.num_threads())
    scratch.resize(packed + per_thread * pool.num_threads());
  float* xt = scratch.data();
  pool.parallel_for(0, num_tiles, 1, [&](int64_t begin, int64_t end, int) {
    const int64_t count = std::min(n, end * tile) - begin * tile;
    kernels.pack_activations(x + begin * tile * k, count, k, k, xt + begin * tile * k);
  });
  pool.parallel_for_dynamic(0, m, chunk, [&](int64_t begin, int64_t end, int thread_index) {
    kernels.panel_gemm(xt, n, k, w.data + begin * stride, w.type, kernels.to_f32[static_cast<int>(w.type)], end - begin,
                       y + begin, m, xt + packed + per_thread * thread_index);
  });
}

}  // namespace

weight_view view_of(const weight_tensor& tensor, int64_t rows, int64_t cols) {
  if (tensor.shape.size() != 2 || tensor.shape[0] != rows || tensor.shape[1] != cols) {
    throw std::runtime_error("tensor '" + tensor.name + "' has shape " + shape_string(tensor.shape) + ", expected [" +
                             std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  if (cols % dtype_block_size(tensor.type) != 0) {
    throw std::runtime_error("tensor '" + tensor.name + "' is " + std::string(dtype_name(tensor.type)) + " with " +
                             std::to_string(cols) + " columns, expected a multiple of its block of " +
                             std::to_string(dtype_block_size(tensor.type)));
  }
  if (tensor.num_bytes < row_bytes(tensor.type, cols) * static_cast<size_t>(rows)) {
    throw std::runtime_error("tensor '" + tensor.name + "' holds " + std::to_string(tensor.num_bytes) +
                             " bytes, too few for its shape");
  }
  check_weight_layout(tensor);
  weight_view view{tensor.type, rows, cols, tensor.data, nullptr, nullptr};
  if (!tensor.row_scales.empty()) view.row_scales = tensor.row_scales.data();
  if (!tensor.input_order.empty()) view.input_order = tensor.input_order.data();
  return view;
}

bool matmul_integer_kernels() { return integer_kernels.load(std::memory_order_relaxed); }
void set_matmul_integer_kernels(bool on) { integer_kernels.store(on, std::memory_order_relaxed); }

bool matmul_batch_invariant(dtype type) {
  if (type == dtype::f32 || type == dtype::f16 || type == dtype::bf16) {
    return float_rows_at_every_count.load(std::memory_order_relaxed);
  }
  return active_quant_kernels().matmul[static_cast<int>(type)] != nullptr && matmul_integer_kernels();
}

bool matmul_float_panels() { return float_panels.load(std::memory_order_relaxed); }
void set_matmul_float_panels(bool on) { float_panels.store(on, std::memory_order_relaxed); }

bool matmul_float_rows_at_every_count() { return float_rows_at_every_count.load(std::memory_order_relaxed); }
void set_matmul_float_rows_at_every_count(bool on) { float_rows_at_every_count.store(on, std::memory_order_relaxed); }

int matmul_gemm_min_rows() { return gemm_min_rows.load(std::memory_order_relaxed); }
void set_matmul_gemm_min_rows(int rows) { gemm_min_rows.store(std::max(1, rows)); }

void matmul(thread_pool& pool, const float* x, int64_t n, const weight_view& w, float* y, std::vector<float>& scratch) {
  if (n <= 0 || w.rows <= 0) return;
  const int64_t m = w.rows;
  const int64_t k = w.cols;
  if (w.input_order) {
    // Act-order columns (GPTQ desc_act): the activations are gathered into the stored column
    // order, O(n·k) against the product's O(n·m·k). The buffer is the calling thread's: matmul
    // runs on a model's forward thread (never on its pool's workers), one per model.
    thread_local std::vector<float> gathered;
    if (gathered.size() < static_cast<size_t>(n * k)) gathered.resize(static_cast<size_t>(n * k));
    float* permuted = gathered.data();  // [n, k]; by pointer: in the pool's threads `gathered` names their own
    const int32_t* order = w.input_order;
    pool.parallel_for(0, n, 1, [&](int64_t begin, int64_t end, int) {
      for (int64_t j = begin; j < end; ++j) {
        for (int64_t c = 0; c < k; ++c) permuted[j * k + c] = x[j * k + order[c]];
      }
    });
    x = permuted;
  }
  matmul_stored(pool, x, n, w, y, scratch);
  if (w.row_scales) {
    const float* scales = w.row_scales;
    auto scale_rows = [&](int64_t begin, int64_t end, int) {
      for (int64_t j = begin; j < end; ++j)
        for (int64_t r = 0; r < m; ++r) y[j * m + r] *= scales[r];
    };
    if (n * m < min_outputs_per_scale_task) {
      scale_rows(0, n, 0);
    } else {
      pool.parallel_for(0, n, 1, scale_rows);
    }
  }
}

namespace {

// y = x · wᵀ over the stored weight as it is (its own column order, no row scales).
void matmul_stored(thread_pool& pool, const float* x, int64_t n, const weight_view& w, float* y,
                   std::vector<float>& scratch) {
  const int64_t m = w.rows;
  const int64_t k = w.cols;
  const size_t stride = row_bytes(w.type, k);
  const row_kernels& kernels = active_kernels();

  const quant_kernels& quantized = active_quant_kernels();
  if (quantized.matmul[static_cast<int>(w.type)] != nullptr && matmul_integer_kernels()) {
    quantized_matmul(pool, quantized, x, n, w, y, scratch);
    return;
  }

  const bool float_type = w.type == dtype::f32 || w.type == dtype::f16 || w.type == dtype::bf16;
  if (float_type && n >= matmul_gemm_min_rows() && matmul_float_rows_at_every_count()) {
    // The row dots at any count: each output is summed in the same order as in a decode step,
    // so a row's bits do not depend on its batch. Blocked for the caches: a chunk of weight rows
    // stays in L2 while the activations pass over it a block at a time, and inside a block each
    // tile of weight rows (row_kernels_impl.hpp) stays in L1 while groups of activation rows pass.
    const dot_rows_fn dot = kernels.dot_rows[static_cast<int>(w.type)];
    const int64_t block = std::max<int64_t>(4, float_activation_block_floats / k / 4 * 4);
    pool.parallel_for_dynamic(0, m, float_chunk_rows, [&](int64_t begin, int64_t end, int) {
      for (int64_t row = begin; row < end; row += float_chunk_rows) {
        const int64_t rows = std::min(float_chunk_rows, end - row);
        for (int64_t j0 = 0; j0 < n; j0 += block) {
          dot(x + j0 * k, std::min(block, n - j0), k, w.data + row * stride, k, rows, y + j0 * m + row, m);
        }
      }
    });
    return;
  }

  if (n < matmul_gemm_min_rows()) {
    const dot_rows_fn dot = kernels.dot_rows[static_cast<int>(w.type)];
    // Contiguous row ranges, a multiple of 16 rows each so threads never share a cache line of y.
    const int64_t per_thread = (m + pool.num_threads() - 1) / pool.num_threads();
    // A chunk is worth a thread only with enough multiply-adds to pay for the hand-off.
    const int64_t min_rows = std::max<int64_t>(16, min_macs_per_chunk / std::max<int64_t>(1, n * k));
    const int64_t grain = std::max<int64_t>(min_rows, (per_thread + 15) / 16 * 16);
    pool.parallel_for(0, m, grain, [&](int64_t begin, int64_t end, int) {
      dot(x, n, k, w.data + begin * stride, k, end - begin, y + begin, m);
    });
    return;
  }

  if (n < kernels.panel_max_rows && kernels.panel_gemm != nullptr && panel_weight_type(w.type) &&
      matmul_float_panels()) {
    panel_matmul(pool, kernels, x, n, w, y, scratch);
    return;
  }

  const to_f32_fn convert = kernels.to_f32[static_cast<int>(w.type)];
  if (n < max_rows_for_cached_slabs) {
    // Larger decode batches and short chunks: each pool thread multiplies slabs of rows with a
    // single-threaded sgemm.
    // Weights stored in another dtype are converted a slab at a time into a buffer small enough
    // to stay in the thread's cache (converting the whole matrix first would write it out to
    // memory as f32 and read it back, as costly as the product itself at these sizes), and
    // OpenBLAS's own threads never run beside the pool's (on few cores they only take turns).
    set_blas_threads(1);
    const bool convert_slabs = w.type != dtype::f32;
    const int64_t slab_rows = std::clamp<int64_t>(cached_slab_floats / k, 16, std::max<int64_t>(16, m));
    const size_t per_thread = convert_slabs ? static_cast<size_t>(slab_rows * k) : 0;
    if (scratch.size() < per_thread * pool.num_threads()) scratch.resize(per_thread * pool.num_threads());
    pool.parallel_for_dynamic(0, m, slab_rows, [&](int64_t begin, int64_t end, int thread_index) {
      float* slab_f32 = scratch.data() + per_thread * thread_index;  // [slab_rows, k]
      for (int64_t row = begin; row < end; row += slab_rows) {
        const int64_t rows = std::min(slab_rows, end - row);
        const float* w_rows = reinterpret_cast<const float*>(w.data + row * stride);  // f32 only
        if (convert_slabs) {
          convert(w.data + row * stride, rows * k, slab_f32);
          w_rows = slab_f32;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(rows),
                    static_cast<int>(k), 1.0f, x, static_cast<int>(k), w_rows, static_cast<int>(k), 0.0f, y + row,
                    static_cast<int>(m));
      }
    });
    return;
  }

  set_blas_threads(pool.num_threads());
  if (w.type == dtype::f32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                1.0f, x, static_cast<int>(k), reinterpret_cast<const float*>(w.data), static_cast<int>(k), 0.0f, y,
                static_cast<int>(m));
    return;
  }
  const int64_t slab_rows = std::max<int64_t>(1, std::min(m, max_slab_floats / k));
  if (scratch.size() < static_cast<size_t>(slab_rows * k)) scratch.resize(slab_rows * k);
  for (int64_t slab = 0; slab < m; slab += slab_rows) {
    const int64_t rows = std::min(slab_rows, m - slab);
    float* slab_f32 = scratch.data();  // [rows, k]
    pool.parallel_for(0, rows, 8, [&](int64_t begin, int64_t end, int) {
      convert(w.data + (slab + begin) * stride, (end - begin) * k, slab_f32 + begin * k);
    });
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(rows),
                static_cast<int>(k), 1.0f, x, static_cast<int>(k), slab_f32, static_cast<int>(k), 0.0f, y + slab,
                static_cast<int>(m));
  }
}

}  // namespace

}  // namespace troupe::cpu
