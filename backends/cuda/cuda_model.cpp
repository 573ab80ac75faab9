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
#include "backends/cuda/linear.hpp"
#include "backends/cuda/linear_weight.hpp"
#include "backends/cuda/nano_batches.hpp"
#include "backends/cuda/ops.hpp"
#include "backends/cuda/paged_attention.hpp"
#include "model/architecture.hpp"
#include "model/kv_transfer.hpp"
#include "model/model_tensors.hpp"
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

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Linear weights keep GGUF block types as stored (cuda::linear_weight); the rest is in the
// activation dtype.
struct layer_weights {
  cuda::linear_weight qkv;       // [(num_heads + 2 * num_kv_heads) * head_dim, hidden]
  device_buffer qkv_bias;        // [(num_heads + 2 * num_kv_heads) * head_dim] (Qwen2) or empty
  cuda::linear_weight o;         // [hidden, num_heads * head_dim]
  cuda::linear_weight gate_up;   // [2 * intermediate, hidden]
  cuda::linear_weight down;      // [hidden, intermediate]
  device_buffer input_norm;      // [hidden]
  device_buffer post_attn_norm;  // [hidden]
  device_buffer q_norm;          // [head_dim] (Qwen3) or empty
  device_buffer k_norm;          // [head_dim] (Qwen3) or empty
};

// Device-side copy of one step's forward_batch plus the attention plan, at fixed offsets so a
// captured graph keeps reading the right places.
struct step_capacity {
  int tokens = 0, seqs = 0, block_ids = 0, work = 0, logits = 0;
};

class cuda_model final : public model {
 public:
  cuda_model(const model_config& config, const weight_store& weights, kv_cache_shape kv_shape,
             const cuda_options& options)
      : config_(config),
        kv_shape_(kv_shape),
        options_(options),
        type_(options.activation),
        kv_type_(options.kv_cache.value_or(options.activation)) {
    validate_config();
    check(cudaSetDevice(options_.device), "cudaSetDevice");
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, options_.device), "cudaGetDeviceProperties");
    device_name_ = properties.name;
    num_sms_ = properties.multiProcessorCount;
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaStreamCreateWithFlags(&kv_copy_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
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
    upload_weights(weights);
    make_linear_layers();
    const std::vector<float> inv_freq = rope_inv_freq(config_);
    inv_freq_.allocate(inv_freq.size() * sizeof(float));
    check(cudaMemcpy(inv_freq_.get(), inv_freq.data(), inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice),
          "upload inv_freq");
    // Activations for a typical step before the KV pool takes what is left.
    ensure_capacity(step_capacity{std::max(2048, options_.max_graph_batch), options_.max_graph_batch, 4096,
                                  options_.max_graph_batch, options_.max_graph_batch},
                    0);
    allocate_kv_pool();
  }

  ~cuda_model() override {
    clear_graphs();
    for (side_lane& lane : side_lanes_) {
      if (lane.done) cudaEventDestroy(lane.done);
      if (lane.stream) cudaStreamDestroy(lane.stream);
    }
    if (step_ready_) cudaEventDestroy(step_ready_);
    for (cudaEvent_t event : layer_kv_written_) {
      if (event) cudaEventDestroy(event);
    }
    if (kv_copy_stream_) cudaStreamDestroy(kv_copy_stream_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const model_config& config() const override { return config_; }
  kv_cache_shape kv_shape() const override { return kv_shape_; }
  std::string backend_name() const override {
    char weights[32];
    std::snprintf(weights, sizeof(weights), "%.1f MiB", static_cast<double>(weight_bytes_) / (1 << 20));
    return "cuda:" + std::to_string(options_.device) + " " + device_name_ + " (" + std::string(dtype_name(type_)) +
           ", KV " + std::string(dtype_name(kv_type_)) + ", weights " + weights + ")";
  }

  void forward(const forward_batch& batch, float* logits) override {
    validate_batch(batch);
    check(cudaSetDevice(options_.device), "cudaSetDevice");
    if (batch.num_tokens() == 0) return;
    compute_logits(batch);
    // Before the download: a copy into pageable memory returns only once it is done, i.e. after
    // the last layer, and the hooks are to run while the later layers compute.
    report_layers_written(batch);
    check(cudaMemcpyAsync(logits, logits_.get(), static_cast<size_t>(batch.num_logits()) * config_.vocab_size * 4,
                          cudaMemcpyDeviceToHost, stream_),
          "download logits");
    check(cudaStreamSynchronize(stream_), "forward");
  }

  // forward_batch::after_layer_kv, between layers. The whole step is already queued on the
  // compute streams with an event recorded after each layer's KV store (run_step); here the
  // forward's thread waits for layer L's events, calls the hook (which exports on
  // kv_copy_stream_, not behind the later layers), and goes on to L + 1 while the GPU computes.
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

  std::optional<device_kv_pool> kv_pool_on_device() const override {
    return device_kv_pool{options_.device,      kv_pool_.get(),    config_.num_layers,
                          kv_shape_.num_blocks, kv_layer_bytes(1), kv_type_};
  }

  // Device-to-host per contiguous run (one block of one side of one layer), then the conversion
  // on the host: simple and enough for a first step; a kernel can convert on the device later.
  // Export and import run on kv_copy_stream_, never on the compute stream: an export from
  // after_layer_kv must not queue behind the layers still computing, and an import from the KV
  // receiver's thread (into blocks no step uses) must not wait for a forward in flight. Every
  // forward synchronizes its streams before it returns, so a copy outside one sees its writes.
  void export_kv(std::span<const int32_t> block_ids, int first_layer, int num_layers, dtype element,
                 std::span<std::byte> out) const override {
    const kv_span_header header =
        kv_span_for(config_, kv_shape_, static_cast<int>(block_ids.size()), first_layer, num_layers, element);
    check_kv_transfer(config_, kv_shape_, block_ids, header, out.size(), kv_transfer_direction::export_from_pool);
    check(cudaSetDevice(options_.device), "cudaSetDevice");
    const size_t run_elements = kv_block_elements(header);
    const size_t run_bytes = kv_bytes(kv_type_, run_elements);
    const size_t span_elements = run_elements * block_ids.size() * 2 * num_layers;
    std::vector<std::byte> staging;  // [span] in the pool's dtype, only when a conversion follows
    std::byte* target = out.data();
    if (element != kv_type_) {
      staging.resize(kv_bytes(kv_type_, span_elements));
      target = staging.data();
    }
    for (int layer = first_layer; layer < first_layer + num_layers; ++layer) {
      for (const void* side : {k_cache(layer), v_cache(layer)}) {
        for (const int32_t block : block_ids) {
          check(cudaMemcpyAsync(target, static_cast<const char*>(side) + static_cast<size_t>(block) * run_bytes,
                                run_bytes, cudaMemcpyDeviceToHost, kv_copy_stream_),
                "export KV block");
          target += run_bytes;
        }
      }
    }
    check(cudaStreamSynchronize(kv_copy_stream_), "export KV");
    if (element != kv_type_) convert_kv_elements(kv_type_, staging.data(), element, out.data(), span_elements);
  }

  void import_kv(std::span<const int32_t> block_ids, const kv_span_header& header,
                 std::span<const std::byte> data) override {
    check_kv_transfer(config_, kv_shape_, block_ids, header, data.size(), kv_transfer_direction::import_into_pool);
    check(cudaSetDevice(options_.device), "cudaSetDevice");
    const size_t run_elements = kv_block_elements(header);
    const size_t run_bytes = kv_bytes(kv_type_, run_elements);
    std::vector<std::byte> staging;  // [span] converted to the pool's dtype
    const std::byte* source = data.data();
    if (header.element != kv_type_) {
      const size_t count = run_elements * block_ids.size() * 2 * header.num_layers;
      staging.resize(kv_bytes(kv_type_, count));
      convert_kv_elements(header.element, data.data(), kv_type_, staging.data(), count);
      source = staging.data();
    }
    for (int layer = header.first_layer; layer < header.first_layer + header.num_layers; ++layer) {
      for (void* side : {k_cache(layer), v_cache(layer)}) {
        for (const int32_t block : block_ids) {
          check(cudaMemcpyAsync(static_cast<char*>(side) + static_cast<size_t>(block) * run_bytes, source, run_bytes,
                                cudaMemcpyHostToDevice, kv_copy_stream_),
                "import KV block");
          source += run_bytes;
        }
      }
    }
    // The host buffers must outlive the copies, and the next forward must see the blocks.
    check(cudaStreamSynchronize(kv_copy_stream_), "import KV");
  }

  bool can_sample_on_device() const override { return true; }

  // The logits stay on the GPU: only the sampling parameters (and the constrained rows' token
  // masks, one [masked rows, words] copy) go up and one id per row comes down.
  void forward_sample(const forward_batch& batch, std::span<const device_sampling_row> rows, int32_t* tokens) override {
    validate_batch(batch);
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
    cuda::sample(logits_.as<float>(), static_cast<int>(rows.size()), config_.vocab_size,
                 sample_params_.as<cuda::sampling_row>(), num_masks > 0 ? sample_masks_.as<uint64_t>() : nullptr,
                 mask_words, sampled_.as<int32_t>(), stream_);
    report_layers_written(batch);  // before the download into pageable memory, as in forward
    check(cudaMemcpyAsync(tokens, sampled_.get(), rows.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
          "download sampled tokens");
    check(cudaStreamSynchronize(stream_), "forward_sample");
  }

 private:
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

  // Everything up to the logits [num_logits, vocab] in logits_, queued on stream_.
  void compute_logits(const forward_batch& batch) {
    const int num_seqs = batch.num_seqs();
    bool decode = options_.cuda_graphs && batch.num_tokens() == num_seqs && batch.num_logits() == num_seqs &&
                  num_seqs <= options_.max_graph_batch;
    for (int i = 0; decode && i < num_seqs; ++i) decode = batch.logits_rows[i] == i;
    // A step that reports each layer's KV records events between layers: kernel by kernel.
    const bool layer_events = static_cast<bool>(batch.after_layer_kv);
    decode = decode && !layer_events;

    // Decode batches are padded to a bucket (padding rows write no KV and see no context).
    const int rows = decode ? graph_bucket(num_seqs) : batch.num_tokens();
    const int seqs = decode ? rows : num_seqs;
    std::vector<int32_t> query_start(batch.query_start);
    for (int i = num_seqs; i < seqs; ++i) query_start.push_back(i + 1);
    int max_context = 0;
    for (int length : batch.context_lengths) max_context = std::max(max_context, length);
    const cuda::paged_attention_plan plan = cuda::plan_paged_attention(
        query_start, config_.num_heads, config_.num_kv_heads, config_.head_dim, decode ? -1 : max_context, num_sms_);

    const int logits_rows = decode ? rows : batch.num_logits();
    const bool grew = ensure_capacity(
        step_capacity{rows, seqs, static_cast<int>(batch.block_tables.size()), plan.num_work(), logits_rows},
        cuda::paged_attention_workspace_floats(plan, config_.num_kv_heads, config_.head_dim));
    if (grew) clear_graphs();
    const size_t meta_bytes = pack_step(batch, rows, seqs, query_start, plan, logits_rows);
    check(cudaMemcpyAsync(meta_device_.get(), meta_host_.get(), meta_bytes, cudaMemcpyHostToDevice, stream_),
          "upload step metadata");

    const std::vector<nano_batch> whole{nano_batch{0, seqs, 0, rows}};
    if (decode) {
      auto it = graphs_.find(rows);
      if (it == graphs_.end()) {
        // First step of this size runs kernel by kernel (settling cuBLASLt's algorithm choice and
        // kernel attributes), then is captured for the steps after it.
        run_step(rows, logits_rows, plan, whole, false);
        capture(rows, logits_rows, plan);
      } else {
        check(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
      }
    } else if (side_lanes_.empty()) {
      run_step(rows, logits_rows, plan, whole, layer_events);
    } else {
      const std::vector<nano_batch> parts =
          plan_nano_batches(query_start, options_.nano_batches, options_.min_nano_batch_rows);
      run_step(rows, logits_rows, plan, parts.empty() ? whole : parts, layer_events);
    }
  }

  void validate_config() const {
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
    if (kv_shape_.block_size <= 0 || kv_shape_.num_blocks < 0) {
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

  // ---- weights ----

  const weight_tensor& expect(const weight_store& weights, const std::string& name, std::vector<int64_t> shape) const {
    const weight_tensor& tensor = weights.get(name);
    if (tensor.shape != shape) {
      throw std::runtime_error("cuda model: tensor '" + name + "' has shape " + shape_string(tensor.shape) +
                               ", expected " + shape_string(shape));
    }
    return tensor;
  }

  // The tensors in `parts`, back to back, converted to the activation dtype (norms, biases).
  device_buffer upload(const std::vector<const weight_tensor*>& parts) {
    int64_t elements = 0;
    for (const weight_tensor* part : parts) elements += part->num_elements();
    device_buffer buffer(static_cast<size_t>(elements) * dtype_size(type_));
    char* cursor = buffer.as<char>();
    for (const weight_tensor* part : parts) {
      cuda::upload_converted(*part, type_, cursor, staging_, stream_);
      cursor += part->num_elements() * dtype_size(type_);
      count_tensor(*part, type_);
    }
    weight_bytes_ += buffer.size();
    return buffer;
  }

  // A linear layer's weight: block types as stored, the rest in the activation dtype.
  cuda::linear_weight upload_linear(const std::vector<const weight_tensor*>& parts) {
    cuda::linear_weight weight = cuda::upload_linear_weight(parts, type_, staging_, stream_);
    for (const weight_tensor* part : parts) count_tensor(*part, cuda::stored_quantized(*part) ? part->type : type_);
    weight_bytes_ += weight.bytes();
    return weight;
  }

  void count_tensor(const weight_tensor& tensor, dtype on_device) {
    std::string key(dtype_name(on_device));
    if (on_device != tensor.type) key = std::string(dtype_name(tensor.type)) + "->" + key;
    ++tensor_counts_[key];
  }

  void upload_weights(const weight_store& weights) {
    const model_config& c = config_;
    const int64_t hidden = c.hidden_size, q_width = int64_t{c.num_heads} * c.head_dim,
                  kv_width = int64_t{c.num_kv_heads} * c.head_dim, inter = c.intermediate_size;
    // Which tensors the model has (biases, q/k norms, its own lm_head) is the loader's list.
    const model_tensor_names names = tensor_names(c);
    embed_ = upload_linear({&expect(weights, names.embed_tokens, {c.vocab_size, hidden})});
    final_norm_ = upload({&expect(weights, names.final_norm, {hidden})});
    // Tied: the output layer reads the embedding table's own storage.
    lm_head_ = names.lm_head != names.embed_tokens
                   ? upload_linear({&expect(weights, names.lm_head, {c.vocab_size, hidden})})
                   : embed_;
    layers_.resize(c.num_layers);
    for (int i = 0; i < c.num_layers; ++i) {
      const layer_tensor_names& n = names.layers[i];
      layer_weights& l = layers_[i];
      l.qkv =
          upload_linear({&expect(weights, n.q_proj, {q_width, hidden}), &expect(weights, n.k_proj, {kv_width, hidden}),
                         &expect(weights, n.v_proj, {kv_width, hidden})});
      if (!n.q_bias.empty()) {
        l.qkv_bias = upload({&expect(weights, n.q_bias, {q_width}), &expect(weights, n.k_bias, {kv_width}),
                             &expect(weights, n.v_bias, {kv_width})});
      }
      l.o = upload_linear({&expect(weights, n.o_proj, {hidden, q_width})});
      l.gate_up =
          upload_linear({&expect(weights, n.gate_proj, {inter, hidden}), &expect(weights, n.up_proj, {inter, hidden})});
      l.down = upload_linear({&expect(weights, n.down_proj, {hidden, inter})});
      l.input_norm = upload({&expect(weights, n.attn_norm, {hidden})});
      l.post_attn_norm = upload({&expect(weights, n.ffn_norm, {hidden})});
      if (!n.q_norm.empty()) {
        l.q_norm = upload({&expect(weights, n.q_norm, {c.head_dim})});
        l.k_norm = upload({&expect(weights, n.k_norm, {c.head_dim})});
      }
    }
    staging_.release();
    std::string counts;
    for (const auto& [type, count] : tensor_counts_)
      counts += (counts.empty() ? "" : ", ") + type + ": " + std::to_string(count);
    spdlog::info("cuda model: {:.1f} MiB of weights on cuda:{} ({})", static_cast<double>(weight_bytes_) / (1 << 20),
                 options_.device, counts);
  }

  // The linear layers of each lane (stream), with a dequantization scratch for one slice of the
  // largest quantized weight (none when every weight is plain).
  void make_linear_layers() {
    size_t scratch = 0;
    auto need = [&](const cuda::linear_weight& w) {
      scratch = std::max(scratch, cuda::dequantize_scratch_bytes(w, type_, options_.dequantize_scratch_bytes));
    };
    need(lm_head_);
    for (const layer_weights& l : layers_) {
      need(l.qkv);
      need(l.o);
      need(l.gate_up);
      need(l.down);
    }
    scratch_bytes_ = scratch;
    linear_ = std::make_unique<cuda::linear>(scratch, options_.quantized_gemv_max_tokens);
    for (side_lane& lane : side_lanes_) {
      lane.linear = std::make_unique<cuda::linear>(scratch, options_.quantized_gemv_max_tokens);
    }
  }

  // Embedding rows for `n` token ids into out [n, hidden]: gathered, or dequantized from a
  // quantized table.
  void embed(const int32_t* ids, void* out, int n, cudaStream_t stream) {
    const cuda::linear_part& part = embed_.parts.front();
    if (cuda::kept_quantized(part.type)) {
      cuda::dequantize_rows(embed_.data(part), part.type, embed_.row_scales_from(0), config_.hidden_size, ids, 0, n,
                            out, config_.hidden_size, type_, stream);
    } else {
      cuda::embedding(embed_.data(part), ids, out, n, config_.hidden_size, type_, stream);
    }
  }

  // ---- KV pool ----

  size_t kv_layer_bytes(int num_blocks) const {
    return static_cast<size_t>(num_blocks) * kv_shape_.block_size *
           kv_bytes(kv_type_, static_cast<size_t>(config_.num_kv_heads) * config_.head_dim);
  }

  void allocate_kv_pool() {
    if (kv_shape_.num_blocks == 0) {
      size_t free_bytes = 0, total_bytes = 0;
      check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
      const double reserved = (1.0 - options_.gpu_memory_utilization) * static_cast<double>(total_bytes);
      const double budget = static_cast<double>(free_bytes) - reserved;
      const double per_block = 2.0 * config_.num_layers * static_cast<double>(kv_layer_bytes(1));
      const int64_t blocks = budget > 0 ? static_cast<int64_t>(budget / per_block) : 0;
      if (blocks < 1) {
        throw std::runtime_error("cuda model: no memory left for the KV pool under gpu_memory_utilization " +
                                 std::to_string(options_.gpu_memory_utilization) + " (" +
                                 std::to_string(free_bytes >> 20) + " MiB free of " +
                                 std::to_string(total_bytes >> 20) + " MiB)");
      }
      const int64_t cap = options_.max_kv_blocks > 0 ? options_.max_kv_blocks : int64_t(1) << 30;
      kv_shape_.num_blocks = static_cast<int>(std::min<int64_t>(blocks, cap));
    }
    kv_pool_.allocate(2 * config_.num_layers * kv_layer_bytes(kv_shape_.num_blocks));
  }

  cudaEvent_t layer_kv_event(int layer, int lane) const {
    return layer_kv_written_[static_cast<size_t>(layer) * options_.nano_batches + lane];
  }

  void* k_cache(int layer) const { return kv_pool_.as<char>() + (2 * layer) * kv_layer_bytes(kv_shape_.num_blocks); }
  void* v_cache(int layer) const {
    return kv_pool_.as<char>() + (2 * layer + 1) * kv_layer_bytes(kv_shape_.num_blocks);
  }

  // ---- per-step buffers ----

  // Grows buffers to hold `need` (geometrically); true when anything moved (graphs go stale).
  bool ensure_capacity(step_capacity need, size_t workspace_floats) {
    bool grew = false;
    auto grow = [](int& have, int want) {
      if (want <= have) return false;
      have = std::max(want, have + have / 2);
      return true;
    };
    step_capacity& cap = capacity_;
    const bool meta_grew = grow(cap.tokens, need.tokens) | grow(cap.seqs, need.seqs) |
                           grow(cap.block_ids, need.block_ids) | grow(cap.work, need.work) |
                           grow(cap.logits, need.logits);
    if (meta_grew || !meta_device_) {
      layout_meta();
      meta_device_.allocate(meta_bytes_);
      meta_host_.allocate(meta_bytes_);
      const model_config& c = config_;
      const size_t t = dtype_size(type_), n = cap.tokens;
      residual_.allocate(n * c.hidden_size * t);
      block_out_.allocate(n * c.hidden_size * t);
      normed_.allocate(n * c.hidden_size * t);
      qkv_.allocate(n * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim * t);
      attn_out_.allocate(n * c.num_heads * c.head_dim * t);
      gate_up_.allocate(n * 2 * c.intermediate_size * t);
      act_.allocate(n * c.intermediate_size * t);
      gathered_.allocate(static_cast<size_t>(cap.logits) * c.hidden_size * t);
      logits_.allocate(static_cast<size_t>(cap.logits) * c.vocab_size * 4);
      grew = true;
    }
    if (workspace_floats * sizeof(float) > workspace_.size()) {
      workspace_.allocate(std::max(workspace_floats * sizeof(float), workspace_.size() * 3 / 2));
      grew = true;
    }
    return grew;
  }

  void layout_meta() {
    const step_capacity& cap = capacity_;
    size_t offset = 0;
    auto place = [&](size_t& field, size_t bytes) {
      field = offset;
      offset += (bytes + 15) / 16 * 16;
    };
    place(off_slots_, cap.tokens * sizeof(int64_t));
    place(off_tokens_, cap.tokens * 4);
    place(off_positions_, cap.tokens * 4);
    place(off_query_start_, (cap.seqs + 1) * 4);
    place(off_context_, cap.seqs * 4);
    place(off_table_start_, (cap.seqs + 1) * 4);
    place(off_work_, cap.work * 2 * 4);
    place(off_logits_rows_, cap.logits * 4);
    place(off_tables_, cap.block_ids * 4);  // last: a step copies only what it uses of it
    meta_bytes_ = offset;
  }

  template <typename T>
  T* host_at(size_t offset) {
    return reinterpret_cast<T*>(meta_host_.as<char>() + offset);
  }
  template <typename T>
  T* device_at(size_t offset) const {
    return reinterpret_cast<T*>(meta_device_.as<char>() + offset);
  }

  // Writes the step into pinned memory; returns how many bytes to upload.
  size_t pack_step(const forward_batch& b, int rows, int seqs, const std::vector<int32_t>& query_start,
                   const cuda::paged_attention_plan& plan, int logits_rows) {
    const int real = b.num_tokens(), real_seqs = b.num_seqs();
    int64_t* slots = host_at<int64_t>(off_slots_);
    int32_t* tokens = host_at<int32_t>(off_tokens_);
    int32_t* positions = host_at<int32_t>(off_positions_);
    for (int i = 0; i < rows; ++i) {
      const bool padding = i >= real;
      slots[i] = padding ? -1 : b.slot_mapping[i];
      tokens[i] = padding ? 0 : b.token_ids[i];
      positions[i] = padding ? 0 : b.positions[i];
    }
    std::memcpy(host_at<int32_t>(off_query_start_), query_start.data(), (seqs + 1) * 4);
    int32_t* context = host_at<int32_t>(off_context_);
    int32_t* table_start = host_at<int32_t>(off_table_start_);
    for (int s = 0; s < seqs; ++s) {
      context[s] = s < real_seqs ? b.context_lengths[s] : 0;
      table_start[s] = s < real_seqs ? b.block_table_start[s] : b.block_table_start[real_seqs];
    }
    table_start[seqs] = b.block_table_start[real_seqs];
    std::memcpy(host_at<int32_t>(off_work_), plan.work_items.data(), plan.work_items.size() * 4);
    int32_t* logits_rows_host = host_at<int32_t>(off_logits_rows_);
    for (int i = 0; i < logits_rows; ++i) logits_rows_host[i] = i < b.num_logits() ? b.logits_rows[i] : i;
    std::memcpy(host_at<int32_t>(off_tables_), b.block_tables.data(), b.block_tables.size() * 4);
    return off_tables_ + b.block_tables.size() * 4;
  }

  void validate_batch(const forward_batch& b) const {
    const int n = b.num_tokens(), seqs = b.num_seqs();
    auto fail = [](const std::string& what) { throw std::runtime_error("cuda model forward: " + what); };
    if (!b.hidden_rows.empty()) fail("hidden states (embeddings) are computed on the CPU backend only, for now");
    if (static_cast<int>(b.positions.size()) != n || static_cast<int>(b.slot_mapping.size()) != n) {
      fail("positions and slot_mapping must have one entry per token (" + std::to_string(n) + ")");
    }
    if (static_cast<int>(b.query_start.size()) != seqs + 1 ||
        static_cast<int>(b.block_table_start.size()) != seqs + 1) {
      fail("query_start and block_table_start must have num_seqs + 1 = " + std::to_string(seqs + 1) + " entries");
    }
    if (b.query_start[0] != 0 || b.query_start[seqs] != n) fail("query_start must run from 0 to num_tokens");
    if (b.block_table_start[0] != 0 || b.block_table_start[seqs] != static_cast<int>(b.block_tables.size())) {
      fail("block_table_start must run from 0 to block_tables.size()");
    }
    const int64_t num_slots = int64_t{kv_shape_.num_blocks} * kv_shape_.block_size;
    for (int s = 0; s < seqs; ++s) {
      const int q_len = b.query_start[s + 1] - b.query_start[s];
      const int blocks = b.block_table_start[s + 1] - b.block_table_start[s];
      if (q_len < 0 || blocks < 0) fail("query_start and block_table_start must not decrease");
      if (b.context_lengths[s] < q_len) {
        fail("sequence " + std::to_string(s) + " has context length " + std::to_string(b.context_lengths[s]) +
             " shorter than its " + std::to_string(q_len) + " new tokens");
      }
      if (int64_t{blocks} * kv_shape_.block_size < b.context_lengths[s]) {
        fail("sequence " + std::to_string(s) + " has " + std::to_string(blocks) + " blocks for context length " +
             std::to_string(b.context_lengths[s]));
      }
    }
    for (int32_t block : b.block_tables) {
      if (block < 0 || block >= kv_shape_.num_blocks) {
        fail("block id " + std::to_string(block) + " outside the pool of " + std::to_string(kv_shape_.num_blocks));
      }
    }
    for (int i = 0; i < n; ++i) {
      if (b.token_ids[i] < 0 || b.token_ids[i] >= config_.vocab_size) {
        fail("token id " + std::to_string(b.token_ids[i]) + " outside the vocabulary of " +
             std::to_string(config_.vocab_size));
      }
      if (b.slot_mapping[i] >= num_slots) {
        fail("slot " + std::to_string(b.slot_mapping[i]) + " outside the pool of " + std::to_string(num_slots));
      }
    }
    for (int32_t row : b.logits_rows) {
      if (row < 0 || row >= n) fail("logits row " + std::to_string(row) + " outside the batch of " + std::to_string(n));
    }
  }

  static int graph_bucket(int num_seqs) {
    int bucket = 1;
    while (bucket < num_seqs) bucket *= 2;
    return bucket;
  }

  // ---- the forward pass ----

  // Row `row` of an activation buffer `width` elements wide.
  template <class T = void>
  T* row_of(const device_buffer& buffer, int row, int width) const {
    return reinterpret_cast<T*>(buffer.as<char>() + static_cast<size_t>(row) * width * dtype_size(type_));
  }

  // Queues the step: every layer for each nano-batch in `parts` (contiguous row ranges, cut
  // between sequences), part 0 on stream_ and part i on side lane i - 1, then the final norm
  // and the logits on stream_ once every part is done. Ops are row-wise except attention, which
  // reads only its own sequences' rows: the parts share the activation buffers without overlap.
  // `layer_events`: record layer_kv_event(layer, part) on each part's stream right after that
  // layer's KV store (report_layers_written waits on them).
  void run_step(int rows, int logits_rows, const cuda::paged_attention_plan& plan, const std::vector<nano_batch>& parts,
                bool layer_events) {
    const model_config& c = config_;
    const int hidden = c.hidden_size, inter = c.intermediate_size;
    const int q_width = c.num_heads * c.head_dim, kv_width = c.num_kv_heads * c.head_dim;
    const int qkv_width = q_width + 2 * kv_width;
    const float eps = c.rms_norm_eps;
    const int32_t* tokens = device_at<int32_t>(off_tokens_);
    const int32_t* positions = device_at<int32_t>(off_positions_);
    const int64_t* slots = device_at<int64_t>(off_slots_);
    if (parts.size() > side_lanes_.size() + 1) throw std::runtime_error("cuda model: more nano-batches than streams");

    cuda::paged_attention_params whole;
    whole.q = qkv_.get();
    whole.q_row_stride = qkv_width;
    whole.out = attn_out_.get();
    whole.query_start = device_at<int32_t>(off_query_start_);
    whole.context_lengths = device_at<int32_t>(off_context_);
    whole.block_table_start = device_at<int32_t>(off_table_start_);
    whole.block_tables = device_at<int32_t>(off_tables_);
    whole.work_items = device_at<int32_t>(off_work_);
    whole.num_work = plan.num_work();
    whole.num_splits = plan.num_splits;
    whole.rows_per_cta = plan.rows_per_cta;
    whole.num_heads = c.num_heads;
    whole.num_kv_heads = c.num_kv_heads;
    whole.head_dim = c.head_dim;
    whole.block_size = kv_shape_.block_size;
    whole.kv_slot_bytes = static_cast<int64_t>(kv_bytes(kv_type_, static_cast<size_t>(c.num_kv_heads) * c.head_dim));
    whole.kv_head_bytes = static_cast<int64_t>(kv_bytes(kv_type_, static_cast<size_t>(c.head_dim)));
    whole.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    if (plan.num_splits > 1) {
      const size_t partial_rows =
          static_cast<size_t>(plan.num_work()) * c.num_kv_heads * plan.num_splits * plan.rows_per_cta;
      whole.partial_out = workspace_.as<float>();
      whole.partial_max = whole.partial_out + partial_rows * c.head_dim;
      whole.partial_sum = whole.partial_max + partial_rows;
    }

    // What each part needs: its stream and matmul, and its share of the attention work items.
    // Work items are in sequence order, so a part's are a contiguous run; its split partials are
    // the same run of the workspace (the kernels index them by work item).
    struct lane_view {
      cudaStream_t stream;
      cuda::linear* mm;
      cuda::paged_attention_params attention;
      int first_row, num_rows;
    };
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
    num_step_lanes_ = static_cast<int>(lanes.size());

    // The side lanes start once the step's metadata (uploaded on stream_) is there.
    if (lanes.size() > 1) {
      check(cudaEventRecord(step_ready_, stream_), "cudaEventRecord");
      for (size_t p = 1; p < lanes.size(); ++p)
        check(cudaStreamWaitEvent(lanes[p].stream, step_ready_, 0), "cudaStreamWaitEvent");
    }

    for (const lane_view& lane : lanes) {
      embed(tokens + lane.first_row, row_of(residual_, lane.first_row, hidden), lane.num_rows, lane.stream);
    }
    for (int i = 0; i < c.num_layers; ++i) {
      const layer_weights& l = layers_[i];
      // One layer of every part before the next layer of any, so each stream always has work
      // queued and the GPU can run one part's matrix products beside another's attention.
      for (size_t p = 0; p < lanes.size(); ++p) {
        lane_view& lane = lanes[p];
        const int r0 = lane.first_row, n = lane.num_rows;
        cudaStream_t s = lane.stream;
        void* residual = row_of(residual_, r0, hidden);
        void* normed = row_of(normed_, r0, hidden);
        void* block_out = row_of(block_out_, r0, hidden);
        void* qkv = row_of(qkv_, r0, qkv_width);
        // Layer 0 normalizes the embeddings; later layers first add the previous MLP's output.
        if (i == 0) {
          cuda::rms_norm(residual, nullptr, l.input_norm.get(), normed, n, hidden, eps, type_, s);
        } else {
          cuda::rms_norm(block_out, residual, l.input_norm.get(), normed, n, hidden, eps, type_, s);
        }
        lane.mm->run(l.qkv, normed, l.qkv_bias.get(), qkv, n, type_, type_, s);
        cuda::rope(qkv, qkv_width, positions + r0, inv_freq_.as<float>(), l.q_norm.get(), l.k_norm.get(), eps, n,
                   c.num_heads, c.num_kv_heads, c.head_dim, type_, s);
        const char* k = static_cast<const char*>(qkv) + static_cast<size_t>(q_width) * dtype_size(type_);
        const char* v = k + static_cast<size_t>(kv_width) * dtype_size(type_);
        cuda::kv_cache_store(k, v, qkv_width, slots + r0, k_cache(i), v_cache(i), n, c.num_kv_heads, c.head_dim, type_,
                             kv_type_, s);
        if (layer_events) check(cudaEventRecord(layer_kv_event(i, static_cast<int>(p)), s), "cudaEventRecord");
        lane.attention.k_cache = k_cache(i);
        lane.attention.v_cache = v_cache(i);
        cuda::paged_attention(lane.attention, type_, kv_type_, s);
        lane.mm->run(l.o, row_of(attn_out_, r0, q_width), nullptr, block_out, n, type_, type_, s);
        cuda::rms_norm(block_out, residual, l.post_attn_norm.get(), normed, n, hidden, eps, type_, s);
        lane.mm->run(l.gate_up, normed, nullptr, row_of(gate_up_, r0, 2 * inter), n, type_, type_, s);
        cuda::silu_and_mul(row_of(gate_up_, r0, 2 * inter), row_of(act_, r0, inter), n, inter, type_, s);
        lane.mm->run(l.down, row_of(act_, r0, inter), nullptr, block_out, n, type_, type_, s);
      }
    }
    for (size_t p = 1; p < lanes.size(); ++p) {
      check(cudaEventRecord(side_lanes_[p - 1].done, lanes[p].stream), "cudaEventRecord");
      check(cudaStreamWaitEvent(stream_, side_lanes_[p - 1].done, 0), "cudaStreamWaitEvent");
    }
    cuda::rms_norm(block_out_.get(), residual_.get(), final_norm_.get(), normed_.get(), rows, hidden, eps, type_,
                   stream_);
    cuda::embedding(normed_.get(), device_at<int32_t>(off_logits_rows_), gathered_.get(), logits_rows, hidden, type_,
                    stream_);
    linear_->run(lm_head_, gathered_.get(), nullptr, logits_.get(), logits_rows, type_, dtype::f32, stream_);
  }

  void capture(int rows, int logits_rows, const cuda::paged_attention_plan& plan) {
    cudaGraph_t graph = nullptr;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      run_step(rows, logits_rows, plan, {nano_batch{0, rows, 0, rows}}, false);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check(status, "cudaGraphInstantiate");
    graphs_.emplace(rows, exec);
  }

  void clear_graphs() {
    for (auto& [rows, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

  model_config config_;
  kv_cache_shape kv_shape_;
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
  int num_step_lanes_ = 1;                 // lanes the last run_step used
  cudaStream_t kv_copy_stream_ = nullptr;  // export_kv / import_kv, beside the compute streams

  cuda::linear_weight embed_;    // [vocab, hidden]
  cuda::linear_weight lm_head_;  // [vocab, hidden]; embed_'s storage when tied
  device_buffer final_norm_;     // [hidden]
  std::vector<layer_weights> layers_;
  device_buffer inv_freq_;                    // [head_dim / 2] f32
  device_buffer staging_;                     // upload staging for weights in another dtype
  size_t weight_bytes_ = 0;                   // device memory the weights take (quantized ones as stored)
  size_t scratch_bytes_ = 0;                  // each lane's dequantization scratch (cuda::linear)
  std::map<std::string, int> tensor_counts_;  // "q4_k": 97, "f32->bf16": 65
  device_buffer kv_pool_;  // per layer: K then V, each [num_blocks, block_size, num_kv_heads, head_dim]

  step_capacity capacity_;
  size_t meta_bytes_ = 0;
  size_t off_slots_ = 0, off_tokens_ = 0, off_positions_ = 0, off_query_start_ = 0, off_context_ = 0,
         off_table_start_ = 0, off_work_ = 0, off_logits_rows_ = 0, off_tables_ = 0;
  device_buffer meta_device_;
  cuda::pinned_buffer meta_host_;
  device_buffer residual_;                 // [tokens, hidden]
  device_buffer block_out_;                // [tokens, hidden] output of o_proj / down_proj
  device_buffer normed_;                   // [tokens, hidden]
  device_buffer qkv_;                      // [tokens, (num_heads + 2 * num_kv_heads) * head_dim]
  device_buffer attn_out_;                 // [tokens, num_heads * head_dim]
  device_buffer gate_up_;                  // [tokens, 2 * intermediate]
  device_buffer act_;                      // [tokens, intermediate]
  device_buffer gathered_;                 // [logits, hidden]
  device_buffer logits_;                   // [logits, vocab] f32
  pinned_buffer sample_params_host_;       // [logits] cuda::sampling_row
  device_buffer sample_params_;            // [logits] cuda::sampling_row
  device_buffer sampled_;                  // [logits] int32 token ids
  pinned_buffer sample_masks_host_;        // [masked rows, ceil(vocab / 64)] uint64 token masks
  device_buffer sample_masks_;             // [masked rows, ceil(vocab / 64)] uint64 token masks
  device_buffer workspace_;                // attention split partials
  std::map<int, cudaGraphExec_t> graphs_;  // decode bucket -> captured step
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
