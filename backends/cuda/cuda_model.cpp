#include "backends/cuda/cuda_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/device_buffer.hpp"
#include "backends/cuda/kv_pool.hpp"
#include "backends/cuda/linear.hpp"
#include "backends/cuda/model_weights.hpp"
#include "backends/cuda/nano_batches.hpp"
#include "backends/cuda/ops.hpp"
#include "backends/cuda/paged_attention.hpp"
#include "backends/cuda/step_buffers.hpp"
#include "backends/cuda/step_graphs.hpp"
#include "model/architecture.hpp"
#include "model/kv_transfer.hpp"
#include "model/rope_frequencies.hpp"

namespace troupe {

bool cuda_device_available(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (why) *why = std::string("no CUDA device: ") + cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky error so later calls report their own
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device: the runtime found none";
    return false;
  }
  return true;
}

namespace {

using cuda::check;
using cuda::device_buffer;
using cuda::pinned_buffer;

size_t dtype_size(dtype type) { return type == dtype::f32 ? 4 : 2; }

// Streams a step may be spread over (cuda_options::nano_batches).
constexpr int max_nano_batches = 4;

class cuda_model final : public model {
 public:
  cuda_model(const model_config& config, const weight_store& weights, kv_cache_shape kv_shape,
             const cuda_options& options)
      : config_(config),
        options_(options),
        type_(options.activation),
        kv_type_(options.kv_cache.value_or(options.activation)),
        buffers_(config, options.activation) {
    validate_config(kv_shape);
    check(cudaSetDevice(options_.device), "cudaSetDevice");
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, options_.device), "cudaGetDeviceProperties");
    device_name_ = properties.name;
    num_sms_ = properties.multiProcessorCount;
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    // Nano-batch 0 runs on stream_; each further one gets a stream, an event to join on, and (once
    // the weights are up) linear layers of its own: two matrix products in flight must not share
    // a cuBLASLt workspace or a dequantization scratch.
    for (int i = 1; i < options_.nano_batches; ++i) {
      side_lanes_.emplace_back();
      side_lane& lane = side_lanes_.back();
      check(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking), "cudaStreamCreate");
      check(cudaEventCreateWithFlags(&lane.done, cudaEventDisableTiming), "cudaEventCreate");
    }
    if (!side_lanes_.empty()) check(cudaEventCreateWithFlags(&step_ready_, cudaEventDisableTiming), "cudaEventCreate");
    // Blocking sync: the forward's thread sleeps on a layer's event instead of spinning, leaving
    // the core to the KV sender's thread (a few µs more latency per layer, on a path that then
    // copies the layer's KV anyway).
    layer_kv_written_.resize(static_cast<size_t>(config_.num_layers) * options_.nano_batches);
    for (cudaEvent_t& event : layer_kv_written_) {
      check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync), "cudaEventCreate");
    }
    weights_ = std::make_unique<cuda::model_weights>(config_, weights, type_, stream_);
    spdlog::info("cuda model: {:.1f} MiB of weights on cuda:{} ({})",
                 static_cast<double>(weights_->bytes()) / (1 << 20), options_.device, weights_->tensor_counts());
    make_linear_layers();
    const std::vector<float> inv_freq = rope_inv_freq(config_);
    inv_freq_.allocate(inv_freq.size() * sizeof(float));
    check(cudaMemcpy(inv_freq_.get(), inv_freq.data(), inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice),
          "upload inv_freq");
    // Activations for a typical step before the KV pool takes what is left.
    buffers_.ensure(cuda::step_capacity{std::max(2048, options_.max_graph_batch), options_.max_graph_batch, 4096,
                                        options_.max_graph_batch, options_.max_graph_batch},
                    0);
    kv_ = std::make_unique<cuda::kv_pool>(config_, kv_shape, kv_type_, options_.gpu_memory_utilization,
                                          options_.max_kv_blocks);
  }

  ~cuda_model() override {
    graphs_.clear();
    for (side_lane& lane : side_lanes_) {
      if (lane.done) cudaEventDestroy(lane.done);
      if (lane.stream) cudaStreamDestroy(lane.stream);
    }
    if (step_ready_) cudaEventDestroy(step_ready_);
    for (cudaEvent_t event : layer_kv_written_) {
      if (event) cudaEventDestroy(event);
    }
    if (stream_) cudaStreamDestroy(stream_);
  }

  const model_config& config() const override { return config_; }
  kv_cache_shape kv_shape() const override { return kv_->shape(); }
  std::string backend_name() const override {
    char weights[32];
    std::snprintf(weights, sizeof(weights), "%.1f MiB", static_cast<double>(weights_->bytes()) / (1 << 20));
    return "cuda:" + std::to_string(options_.device) + " " + device_name_ + " (" + std::string(dtype_name(type_)) +
           ", KV " + std::string(dtype_name(kv_type_)) + ", weights " + weights + ")";
  }

  void forward(const forward_batch& batch, float* logits) override {
    cuda::check_cuda_batch(batch, config_, kv_->shape());
    check(cudaSetDevice(options_.device), "cudaSetDevice");
    if (batch.num_tokens() == 0) return;
    compute_logits(batch);
    // Before the download: a copy into pageable memory returns only once it is done, i.e. after
    // the last layer, and the hooks are to run while the later layers compute.
    report_layers_written(batch);
    check(
        cudaMemcpyAsync(logits, buffers_.logits.get(), static_cast<size_t>(batch.num_logits()) * config_.vocab_size * 4,
                        cudaMemcpyDeviceToHost, stream_),
        "download logits");
    check(cudaStreamSynchronize(stream_), "forward");
  }

  // forward_batch::after_layer_kv, between layers. The whole step is already queued on the
  // compute streams with an event recorded after each layer's KV store (run_step); here the
  // forward's thread waits for layer L's events, calls the hook (which exports on the KV pool's
  // copy stream, not behind the later layers), and goes on to L + 1 while the GPU computes.
  // The other way, synchronizing the compute stream after each layer's store, would be simpler
  // but drains the GPU's queue at every layer: the next layer's kernels would be launched only
  // once the hook returned, so the device would idle for the export and the launches, and
  // nothing would overlap on the GPU side. The events cost one record per layer and lane, and
  // only when a hook is set; such a step runs kernel by kernel (a captured graph has no place to
  // return to the host between layers), which prefill steps do anyway.
  void report_layers_written(const forward_batch& batch) {
    if (!batch.after_layer_kv) return;
    try {
      for (int layer = 0; layer < config_.num_layers; ++layer) {
        for (int lane = 0; lane < num_step_lanes_; ++lane) {
          check(cudaEventSynchronize(layer_kv_event(layer, lane)), "wait for a layer's KV");
        }
        batch.after_layer_kv(layer);
      }
    } catch (...) {
      // Nothing may still be writing into buffers the caller reuses once the forward has thrown.
      cudaStreamSynchronize(stream_);
      for (const side_lane& lane : side_lanes_) cudaStreamSynchronize(lane.stream);
      throw;
    }
  }

  dtype kv_dtype() const override { return kv_type_; }

  std::optional<device_kv_pool> kv_pool_on_device() const override { return kv_->on_device(options_.device); }

  void export_kv(std::span<const int32_t> block_ids, int first_layer, int num_layers, dtype element,
                 std::span<std::byte> out) const override {
    const kv_span_header header =
        kv_span_for(config_, kv_->shape(), static_cast<int>(block_ids.size()), first_layer, num_layers, element);
    check_kv_transfer(config_, kv_->shape(), block_ids, header, out.size(), kv_transfer_direction::export_from_pool);
    check(cudaSetDevice(options_.device), "cudaSetDevice");
    kv_->export_blocks(block_ids, header, out);
  }

  void import_kv(std::span<const int32_t> block_ids, const kv_span_header& header,
                 std::span<const std::byte> data) override {
    check_kv_transfer(config_, kv_->shape(), block_ids, header, data.size(), kv_transfer_direction::import_into_pool);
    check(cudaSetDevice(options_.device), "cudaSetDevice");
    kv_->import_blocks(block_ids, header, data);
  }

  bool can_sample_on_device() const override { return true; }

  // The logits stay on the GPU: only the sampling parameters (and the constrained rows' token
  // masks, one [masked rows, words] copy) go up and one id per row comes down.
  void forward_sample(const forward_batch& batch, std::span<const device_sampling_row> rows, int32_t* tokens) override {
    cuda::check_cuda_batch(batch, config_, kv_->shape());
    if (rows.size() != static_cast<size_t>(batch.num_logits())) {
      throw std::runtime_error("cuda model: " + std::to_string(rows.size()) + " sampling rows for " +
                               std::to_string(batch.num_logits()) + " logits rows");
    }
    check(cudaSetDevice(options_.device), "cudaSetDevice");
    if (batch.num_tokens() == 0 || rows.empty()) return;
    compute_logits(batch);
    const size_t params_bytes = rows.size() * sizeof(cuda::sampling_row);
    if (sample_params_host_.size() < params_bytes) {
      sample_params_host_.allocate(params_bytes);
      sample_params_.allocate(params_bytes);
      sampled_.allocate(rows.size() * sizeof(int32_t));
    }
    auto* params = sample_params_host_.as<cuda::sampling_row>();
    int num_masks = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      params[i] = cuda::sampling_row{rows[i].temperature, rows[i].top_k, rows[i].top_p, rows[i].seed, rows[i].offset};
      if (!rows[i].allowed_bits.empty()) params[i].mask_row = num_masks++;
    }
    check(cudaMemcpyAsync(sample_params_.get(), params, params_bytes, cudaMemcpyHostToDevice, stream_),
          "upload sampling rows");
    const int mask_words = (config_.vocab_size + 63) / 64;
    if (num_masks > 0) upload_masks(rows, num_masks, mask_words);
    cuda::sample(buffers_.logits.as<float>(), static_cast<int>(rows.size()), config_.vocab_size,
                 sample_params_.as<cuda::sampling_row>(), num_masks > 0 ? sample_masks_.as<uint64_t>() : nullptr,
                 mask_words, sampled_.as<int32_t>(), stream_);
    report_layers_written(batch);  // before the download into pageable memory, as in forward
    check(cudaMemcpyAsync(tokens, sampled_.get(), rows.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
          "download sampled tokens");
    check(cudaStreamSynchronize(stream_), "forward_sample");
  }

 private:
  // One nano-batch's share of a step: its stream and matrix products, its rows and its share of
  // the attention's work items.
  struct lane_view {
    cudaStream_t stream;
    cuda::linear* mm;
    cuda::paged_attention_params attention;
    int first_row, num_rows;
  };

  // The masked rows' allowed_bits, in row order, as [num_masks, mask_words] on the device (a
  // shorter mask refuses the tokens past its end). The buffers only grow: the next step reuses them.
  void upload_masks(std::span<const device_sampling_row> rows, int num_masks, int mask_words) {
    const size_t mask_bytes = static_cast<size_t>(num_masks) * mask_words * sizeof(uint64_t);
    if (sample_masks_host_.size() < mask_bytes) {
      sample_masks_host_.allocate(mask_bytes);
      sample_masks_.allocate(mask_bytes);
    }
    uint64_t* masks = sample_masks_host_.as<uint64_t>();
    for (const device_sampling_row& row : rows) {
      if (row.allowed_bits.empty()) continue;
      const size_t copied = std::min(row.allowed_bits.size(), static_cast<size_t>(mask_words));
      std::copy_n(row.allowed_bits.begin(), copied, masks);
      std::fill(masks + copied, masks + mask_words, uint64_t{0});
      masks += mask_words;
    }
    check(cudaMemcpyAsync(sample_masks_.get(), sample_masks_host_.get(), mask_bytes, cudaMemcpyHostToDevice, stream_),
          "upload token masks");
  }

  // Everything up to the logits [num_logits, vocab] in buffers_.logits, queued on stream_.
  void compute_logits(const forward_batch& batch) {
    const int num_seqs = batch.num_seqs();
    bool decode = options_.cuda_graphs && batch.num_tokens() == num_seqs && batch.num_logits() == num_seqs &&
                  num_seqs <= options_.max_graph_batch;
    for (int i = 0; decode && i < num_seqs; ++i) decode = batch.logits_rows[i] == i;
    // A step that reports each layer's KV records events between layers: kernel by kernel.
    const bool layer_events = static_cast<bool>(batch.after_layer_kv);
    decode = decode && !layer_events;

    // Decode batches are padded to a bucket (padding rows write no KV and see no context).
    const int rows = decode ? cuda::step_graphs::bucket(num_seqs) : batch.num_tokens();
    const int seqs = decode ? rows : num_seqs;
    std::vector<int32_t> query_start(batch.query_start);
    for (int i = num_seqs; i < seqs; ++i) query_start.push_back(i + 1);
    int max_context = 0;
    for (int length : batch.context_lengths) max_context = std::max(max_context, length);
    const cuda::paged_attention_plan plan = cuda::plan_paged_attention(
        query_start, config_.num_heads, config_.num_kv_heads, config_.head_dim, decode ? -1 : max_context, num_sms_);

    const int logits_rows = decode ? rows : batch.num_logits();
    const bool grew = buffers_.ensure(
        cuda::step_capacity{rows, seqs, static_cast<int>(batch.block_tables.size()), plan.num_work(), logits_rows},
        cuda::paged_attention_workspace_floats(plan, config_.num_kv_heads, config_.head_dim));
    if (grew) graphs_.clear();
    buffers_.upload(buffers_.pack(batch, rows, seqs, query_start, plan, logits_rows), stream_);

    const std::vector<nano_batch> whole{nano_batch{0, seqs, 0, rows}};
    if (decode) {
      if (cudaGraphExec_t graph = graphs_.find(rows)) {
        check(cudaGraphLaunch(graph, stream_), "cudaGraphLaunch");
      } else {
        // First step of this size runs kernel by kernel (settling cuBLASLt's algorithm choice and
        // kernel attributes), then is captured for the steps after it.
        run_step(rows, logits_rows, plan, whole, false);
        graphs_.capture(rows, stream_, [&] { run_step(rows, logits_rows, plan, whole, false); });
      }
    } else if (side_lanes_.empty()) {
      run_step(rows, logits_rows, plan, whole, layer_events);
    } else {
      const std::vector<nano_batch> parts =
          plan_nano_batches(query_start, options_.nano_batches, options_.min_nano_batch_rows);
      run_step(rows, logits_rows, plan, parts.empty() ? whole : parts, layer_events);
    }
  }

  void validate_config(kv_cache_shape kv_shape) const {
    const model_config& c = config_;
    if (c.hidden_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 ||
        c.vocab_size <= 0 || c.intermediate_size <= 0) {
      throw std::runtime_error(
          "cuda model: config has a non-positive size (hidden, layers, heads, head_dim, vocab, "
          "intermediate must all be > 0)");
    }
    if (c.num_heads % c.num_kv_heads != 0) {
      throw std::runtime_error("cuda model: num_heads " + std::to_string(c.num_heads) +
                               " is not a multiple of num_kv_heads " + std::to_string(c.num_kv_heads));
    }
    if (c.head_dim % 8 != 0) {
      throw std::runtime_error("cuda model: head_dim " + std::to_string(c.head_dim) + " is not a multiple of 8");
    }
    if (type_ != dtype::f32 && type_ != dtype::f16 && type_ != dtype::bf16) {
      throw std::runtime_error("cuda model: activation dtype " + std::string(dtype_name(type_)) +
                               " is not supported (expected f32, f16 or bf16)");
    }
    check_kv_element(kv_type_, c.head_dim);  // q8_0 needs head_dim % 32 == 0
    if (kv_shape.block_size <= 0 || kv_shape.num_blocks < 0) {
      throw std::runtime_error("cuda model: kv block_size must be > 0 and num_blocks >= 0");
    }
    if (options_.max_graph_batch < 1) throw std::runtime_error("cuda model: max_graph_batch must be >= 1");
    if (options_.nano_batches < 1 || options_.nano_batches > max_nano_batches) {
      throw std::runtime_error("cuda model: nano_batches must be in [1, " + std::to_string(max_nano_batches) +
                               "], got " + std::to_string(options_.nano_batches));
    }
    if (options_.min_nano_batch_rows < 1) throw std::runtime_error("cuda model: min_nano_batch_rows must be >= 1");
    if (options_.quantized_gemv_max_tokens < 0) {
      throw std::runtime_error("cuda model: quantized_gemv_max_tokens must be >= 0, got " +
                               std::to_string(options_.quantized_gemv_max_tokens));
    }
  }

  // The linear layers of each lane (stream), with a dequantization scratch for one slice of the
  // largest quantized weight (none when every weight is plain).
  void make_linear_layers() {
    const size_t scratch = weights_->dequantize_scratch_bytes(options_.dequantize_scratch_bytes);
    linear_ = std::make_unique<cuda::linear>(scratch, options_.quantized_gemv_max_tokens);
    for (side_lane& lane : side_lanes_) {
      lane.linear = std::make_unique<cuda::linear>(scratch, options_.quantized_gemv_max_tokens);
    }
  }

  cudaEvent_t layer_kv_event(int layer, int lane) const {
    return layer_kv_written_[static_cast<size_t>(layer) * options_.nano_batches + lane];
  }

  // Row `row` of an activation buffer `width` elements wide.
  template <class T = void>
  T* row_of(const device_buffer& buffer, int row, int width) const {
    return reinterpret_cast<T*>(buffer.as<char>() + static_cast<size_t>(row) * width * dtype_size(type_));
  }

  // ---- the forward pass ----

  // Queues the step: every layer for each nano-batch in `parts` (contiguous row ranges, cut
  // between sequences), part 0 on stream_ and part i on side lane i - 1, then the final norm
  // and the logits on stream_ once every part is done. Ops are row-wise except attention, which
  // reads only its own sequences' rows: the parts share the activation buffers without overlap.
  // `layer_events`: record layer_kv_event(layer, part) on each part's stream right after that
  // layer's KV store (report_layers_written waits on them).
  void run_step(int rows, int logits_rows, const cuda::paged_attention_plan& plan, const std::vector<nano_batch>& parts,
                bool layer_events) {
    std::vector<lane_view> lanes = lanes_for(plan, parts);
    num_step_lanes_ = static_cast<int>(lanes.size());
    // The side lanes start once the step's metadata (uploaded on stream_) is there.
    if (lanes.size() > 1) {
      check(cudaEventRecord(step_ready_, stream_), "cudaEventRecord");
      for (size_t p = 1; p < lanes.size(); ++p)
        check(cudaStreamWaitEvent(lanes[p].stream, step_ready_, 0), "cudaStreamWaitEvent");
    }
    const int hidden = config_.hidden_size;
    for (const lane_view& lane : lanes) {
      weights_->embed(buffers_.tokens() + lane.first_row, row_of(buffers_.residual, lane.first_row, hidden),
                      lane.num_rows, lane.stream);
    }
    // One layer of every part before the next layer of any, so each stream always has work
    // queued and the GPU can run one part's matrix products beside another's attention.
    for (int layer = 0; layer < config_.num_layers; ++layer) {
      for (size_t p = 0; p < lanes.size(); ++p) {
        queue_layer(layer, lanes[p], layer_events ? layer_kv_event(layer, static_cast<int>(p)) : nullptr);
      }
    }
    for (size_t p = 1; p < lanes.size(); ++p) {
      check(cudaEventRecord(side_lanes_[p - 1].done, lanes[p].stream), "cudaEventRecord");
      check(cudaStreamWaitEvent(stream_, side_lanes_[p - 1].done, 0), "cudaStreamWaitEvent");
    }
    cuda::rms_norm(buffers_.block_out.get(), buffers_.residual.get(), weights_->final_norm().get(),
                   buffers_.normed.get(), rows, hidden, config_.rms_norm_eps, type_, stream_);
    cuda::embedding(buffers_.normed.get(), buffers_.logits_rows(), buffers_.gathered.get(), logits_rows, hidden, type_,
                    stream_);
    linear_->run(weights_->lm_head(), buffers_.gathered.get(), nullptr, buffers_.logits.get(), logits_rows, type_,
                 dtype::f32, stream_);
  }

  // What each part needs: its stream and matmul, and its share of the attention work items.
  // Work items are in sequence order, so a part's are a contiguous run; its split partials are
  // the same run of the workspace (the kernels index them by work item).
  std::vector<lane_view> lanes_for(const cuda::paged_attention_plan& plan, const std::vector<nano_batch>& parts) {
    const model_config& c = config_;
    if (parts.size() > side_lanes_.size() + 1) throw std::runtime_error("cuda model: more nano-batches than streams");
    cuda::paged_attention_params whole;
    whole.q = buffers_.qkv.get();
    whole.q_row_stride = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
    whole.out = buffers_.attn_out.get();
    whole.query_start = buffers_.query_start();
    whole.context_lengths = buffers_.context_lengths();
    whole.block_table_start = buffers_.block_table_start();
    whole.block_tables = buffers_.block_tables();
    whole.work_items = buffers_.work_items();
    whole.num_work = plan.num_work();
    whole.num_splits = plan.num_splits;
    whole.rows_per_cta = plan.rows_per_cta;
    whole.num_heads = c.num_heads;
    whole.num_kv_heads = c.num_kv_heads;
    whole.head_dim = c.head_dim;
    whole.block_size = kv_->shape().block_size;
    whole.kv_slot_bytes = static_cast<int64_t>(kv_bytes(kv_type_, static_cast<size_t>(c.num_kv_heads) * c.head_dim));
    whole.kv_head_bytes = static_cast<int64_t>(kv_bytes(kv_type_, static_cast<size_t>(c.head_dim)));
    whole.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    if (plan.num_splits > 1) {
      const size_t partial_rows =
          static_cast<size_t>(plan.num_work()) * c.num_kv_heads * plan.num_splits * plan.rows_per_cta;
      whole.partial_out = buffers_.workspace.as<float>();
      whole.partial_max = whole.partial_out + partial_rows * c.head_dim;
      whole.partial_sum = whole.partial_max + partial_rows;
    }
    std::vector<lane_view> lanes;
    int work = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
      lane_view lane{p == 0 ? stream_ : side_lanes_[p - 1].stream,
                     p == 0 ? linear_.get() : side_lanes_[p - 1].linear.get(), whole, parts[p].first_row,
                     parts[p].num_rows()};
      int end_work = work;
      while (end_work < plan.num_work() && plan.work_items[2 * end_work] < parts[p].end_seq) ++end_work;
      const size_t skipped = static_cast<size_t>(work) * c.num_kv_heads * plan.num_splits * plan.rows_per_cta;
      lane.attention.work_items = whole.work_items + 2 * work;
      lane.attention.num_work = end_work - work;
      if (plan.num_splits > 1) {
        lane.attention.partial_out = whole.partial_out + skipped * c.head_dim;
        lane.attention.partial_max = whole.partial_max + skipped;
        lane.attention.partial_sum = whole.partial_sum + skipped;
      }
      work = end_work;
      lanes.push_back(lane);
    }
    if (work != plan.num_work()) throw std::runtime_error("cuda model: nano-batches do not cover the attention plan");
    return lanes;
  }

  // One transformer layer of one part's rows, queued on its stream; its KV is stored before its
  // attention reads the pool, and `kv_written` (when not null) is recorded right after the store.
  void queue_layer(int layer, lane_view& lane, cudaEvent_t kv_written) {
    const model_config& c = config_;
    const cuda::layer_weights& l = weights_->layer(layer);
    const int hidden = c.hidden_size, inter = c.intermediate_size;
    const int q_width = c.num_heads * c.head_dim, kv_width = c.num_kv_heads * c.head_dim;
    const int qkv_width = q_width + 2 * kv_width;
    const float eps = c.rms_norm_eps;
    const int r0 = lane.first_row, n = lane.num_rows;
    cudaStream_t s = lane.stream;
    void* residual = row_of(buffers_.residual, r0, hidden);
    void* normed = row_of(buffers_.normed, r0, hidden);
    void* block_out = row_of(buffers_.block_out, r0, hidden);
    void* qkv = row_of(buffers_.qkv, r0, qkv_width);
    // Layer 0 normalizes the embeddings; later layers first add the previous MLP's output.
    if (layer == 0) {
      cuda::rms_norm(residual, nullptr, l.input_norm.get(), normed, n, hidden, eps, type_, s);
    } else {
      cuda::rms_norm(block_out, residual, l.input_norm.get(), normed, n, hidden, eps, type_, s);
    }
    lane.mm->run(l.qkv, normed, l.qkv_bias.get(), qkv, n, type_, type_, s);
    cuda::rope(qkv, qkv_width, buffers_.positions() + r0, inv_freq_.as<float>(), l.q_norm.get(), l.k_norm.get(), eps, n,
               c.num_heads, c.num_kv_heads, c.head_dim, type_, s);
    const char* k = static_cast<const char*>(qkv) + static_cast<size_t>(q_width) * dtype_size(type_);
    const char* v = k + static_cast<size_t>(kv_width) * dtype_size(type_);
    cuda::kv_cache_store(k, v, qkv_width, buffers_.slots() + r0, kv_->keys(layer), kv_->values(layer), n,
                         c.num_kv_heads, c.head_dim, type_, kv_type_, s);
    if (kv_written) check(cudaEventRecord(kv_written, s), "cudaEventRecord");
    lane.attention.k_cache = kv_->keys(layer);
    lane.attention.v_cache = kv_->values(layer);
    cuda::paged_attention(lane.attention, type_, kv_type_, s);
    lane.mm->run(l.o, row_of(buffers_.attn_out, r0, q_width), nullptr, block_out, n, type_, type_, s);
    cuda::rms_norm(block_out, residual, l.post_attn_norm.get(), normed, n, hidden, eps, type_, s);
    lane.mm->run(l.gate_up, normed, nullptr, row_of(buffers_.gate_up, r0, 2 * inter), n, type_, type_, s);
    cuda::silu_and_mul(row_of(buffers_.gate_up, r0, 2 * inter), row_of(buffers_.act, r0, inter), n, inter, type_, s);
    lane.mm->run(l.down, row_of(buffers_.act, r0, inter), nullptr, block_out, n, type_, type_, s);
  }

  model_config config_;
  cuda_options options_;
  dtype type_;
  dtype kv_type_;  // the KV pool's element type
  std::string device_name_;
  int num_sms_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::linear> linear_;
  // Nano-batches 1.. run on these (nano-batch 0 on stream_ and linear_).
  struct side_lane {
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;  // recorded after the lane's last layer; stream_ waits on it
    std::unique_ptr<cuda::linear> linear;
  };
  std::vector<side_lane> side_lanes_;
  cudaEvent_t step_ready_ = nullptr;  // recorded on stream_ after the metadata upload
  // [num_layers, nano_batches]: layer L's KV store done on lane p (steps with after_layer_kv).
  std::vector<cudaEvent_t> layer_kv_written_;
  int num_step_lanes_ = 1;  // lanes the last run_step used

  std::unique_ptr<cuda::model_weights> weights_;
  device_buffer inv_freq_;  // [head_dim / 2] f32
  cuda::step_buffers buffers_;
  std::unique_ptr<cuda::kv_pool> kv_;
  cuda::step_graphs graphs_;
  pinned_buffer sample_params_host_;  // [logits] cuda::sampling_row
  device_buffer sample_params_;       // [logits] cuda::sampling_row
  device_buffer sampled_;             // [logits] int32 token ids
  pinned_buffer sample_masks_host_;   // [masked rows, ceil(vocab / 64)] uint64 token masks
  device_buffer sample_masks_;        // [masked rows, ceil(vocab / 64)] uint64 token masks
};

// The CUDA forward is the Llama family's (llama, mistral, qwen2, qwen3): the blocks of the other
// architectures (experts, Gemma's norms and GeGLU, partial and scaled RoPE) run on the CPU only
// until they are ported (issue 22, phase 2).
void check_cuda_supports(const model_config& c) {
  const architecture_traits& t = traits_of(c.arch);
  std::string missing;
  if (t.experts || c.moe.num_experts > 0)
    missing = "mixture-of-experts layers";
  else if (t.norm != norm_kind::rms || t.post_block_norms || t.scale_embeddings)
    missing = "Gemma's norms and embedding scale";
  else if (c.activation != activation_kind::silu)
    missing = "activations other than SiLU";
  else if (t.output_bias || c.attention_sinks || c.attn_logit_softcapping > 0 || c.final_logit_softcapping > 0)
    missing = "attention extras";
  else if (c.sliding_window > 0 && c.sliding_window < c.max_position_embeddings &&
           std::find(c.sliding_layers.begin(), c.sliding_layers.end(), true) != c.sliding_layers.end()) {
    missing = "sliding-window attention (window " + std::to_string(c.sliding_window) + " of a " +
              std::to_string(c.max_position_embeddings) + "-token context)";
  } else if (c.rotary_dim > 0 || (c.rope_scaling && c.rope_scaling->type != rope_scaling_type::llama3))
    missing = "partial or scaled RoPE other than llama3";
  if (!missing.empty()) {
    throw std::runtime_error("the CUDA backend does not run " + std::string(t.hf_name) + " yet (" + missing +
                             "); use --device cpu");
  }
}

}  // namespace

std::unique_ptr<model> make_cuda_model(const model_config& config, const weight_store& weights, kv_cache_shape kv_shape,
                                       const cuda_options& options) {
  check_cuda_supports(config);
  std::string why;
  if (!cuda_device_available(&why)) throw std::runtime_error("make_cuda_model: " + why);
  return std::make_unique<cuda_model>(config, weights, kv_shape, options);
}

}  // namespace troupe
