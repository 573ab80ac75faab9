#include "backends/backend_selection.hpp"

#include <stdexcept>

#include "backends/cpu/cpu_model.hpp"
#include "backends/cpu/matmul.hpp"

#ifdef TROUPE_HAVE_CUDA
#include "backends/cuda/cuda_model.hpp"
#endif

namespace troupe {

namespace {

// Probing the driver costs a CUDA context's worth of time only once.
bool gpu_answers(std::string& why) {
#ifdef TROUPE_HAVE_CUDA
  return cuda_device_available(&why);
#else
  why = "this build has no CUDA backend (configured without nvcc or with TROUPE_ENABLE_CUDA=OFF)";
  return false;
#endif
}

}  // namespace

bool cuda_backend_compiled() {
#ifdef TROUPE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

device_request parse_device_request(std::string_view name) {
  if (name == "cpu") return device_request::cpu;
  if (name == "cuda") return device_request::cuda;
  if (name == "auto") return device_request::auto_detect;
  throw std::runtime_error("device must be \"cpu\", \"cuda\" or \"auto\", got \"" + std::string(name) + "\"");
}

std::string_view device_request_name(device_request request) {
  switch (request) {
    case device_request::cpu: return "cpu";
    case device_request::cuda: return "cuda";
    case device_request::auto_detect: return "auto";
  }
  return "cpu";
}

dtype parse_activation_dtype(std::string_view name) {
  if (name == "f32") return dtype::f32;
  if (name == "f16") return dtype::f16;
  if (name == "bf16") return dtype::bf16;
  throw std::runtime_error("dtype must be f32, f16 or bf16, got \"" + std::string(name) + "\"");
}

std::optional<dtype> parse_kv_cache_dtype(std::string_view name) {
  if (name == "auto") return std::nullopt;
  for (dtype type : {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::fp8_e4m3}) {
    if (name == dtype_name(type)) return type;
  }
  throw std::runtime_error("kv_cache_dtype must be auto, f32, f16, bf16, q8_0 or fp8_e4m3, got \"" + std::string(name) +
                           "\"");
}

namespace {

// Whether every matrix a decoder layer multiplies by (attention, MLP, experts, routers) gives a
// row the same bits whatever shares its batch on the CPU.
bool layers_batch_invariant_on_cpu(const weight_store& weights) {
  for (const auto& [name, tensor] : weights.tensors()) {
    if (name.rfind("model.layers.", 0) != 0 || tensor.shape.size() < 2) continue;
    if (!cpu::matmul_batch_invariant(tensor.type)) return false;
  }
  return true;
}

}  // namespace

dtype resolve_kv_cache_dtype(const backend_options& options, device_kind device, const weight_store& weights) {
  if (const std::optional<dtype> chosen = parse_kv_cache_dtype(options.kv_cache_dtype)) return *chosen;
  if (device == device_kind::cuda) return options.cuda_dtype;
  // f16 halves the bytes long contexts pay for, and is safe where the K and V a token gets are
  // the same bits however its step was batched and cut: attention is bit-invariant
  // (paged_attention_kernels.hpp) and so are the integer kernels. Float weights' products are
  // not (row dots below 32 rows, sgemm from there), and a 16-bit cache would round their
  // last-bit differences apart now and then: a 1P1D pair or a failover re-run would no longer
  // answer exactly as one process (seen: 2 of 200 seeded requests of stories260K). They keep f32.
  return layers_batch_invariant_on_cpu(weights) ? dtype::f16 : dtype::f32;
}

void backend_options::validate() const {
  if (threads < 0) throw std::runtime_error("threads must be 0 (all) or positive, got " + std::to_string(threads));
  if (!(gpu_memory_utilization > 0.0f && gpu_memory_utilization <= 1.0f)) {
    throw std::runtime_error("gpu_memory_utilization must be in (0, 1], got " + std::to_string(gpu_memory_utilization));
  }
  if (cuda_dtype != dtype::f32 && cuda_dtype != dtype::f16 && cuda_dtype != dtype::bf16) {
    throw std::runtime_error("dtype must be f32, f16 or bf16, got " + std::string(dtype_name(cuda_dtype)));
  }
  parse_kv_cache_dtype(kv_cache_dtype);
  if (nano_batches < 1 || nano_batches > 4) {
    throw std::runtime_error("nano_batches must be 1 to 4, got " + std::to_string(nano_batches));
  }
}

device_choice choose_device(device_request requested) {
  if (requested == device_request::cpu) return {device_kind::cpu, ""};
  std::string why;
  if (gpu_answers(why)) return {device_kind::cuda, ""};
  if (requested == device_request::cuda) {
    throw std::runtime_error("--device cuda: no usable GPU (" + why +
                             "); --device auto runs on the CPU when there is none, --device cpu always does");
  }
  return {device_kind::cpu, "device auto: " + why + "; running on the CPU"};
}

std::unique_ptr<model> make_backend_model(const model_config& config, const weight_store& weights, device_kind device,
                                          const kv_pool_request& kv, const backend_options& options) {
  if (device == device_kind::cuda) {
    if (!options.layers.resolved(config.num_layers).whole(config.num_layers)) {
      throw std::runtime_error("pipeline stage of layers " +
                               layer_range_text(options.layers.resolved(config.num_layers)) +
                               ": pipeline stages run on the CPU backend only so far (use --device cpu)");
    }
#ifdef TROUPE_HAVE_CUDA
    options.validate();
    cuda_options cuda;
    cuda.gpu_memory_utilization = options.gpu_memory_utilization;
    cuda.activation = options.cuda_dtype;
    cuda.max_kv_blocks = kv.max_useful_blocks;
    cuda.nano_batches = options.nano_batches;
    cuda.kv_cache = resolve_kv_cache_dtype(options, device, weights);
    // num_blocks 0 lets the CUDA model size its pool from the free memory left after the weights.
    return make_cuda_model(config, weights, kv_cache_shape{kv.num_blocks, kv.block_size}, cuda);
#else
    throw std::runtime_error("make_backend_model: this build has no CUDA backend");
#endif
  }
  options.validate();
  const dtype kv_dtype = resolve_kv_cache_dtype(options, device, weights);
  int num_blocks = kv.num_blocks;
  if (num_blocks == 0) {
    num_blocks = cpu_kv_blocks_for_budget(config, kv.cpu_budget_bytes, kv.block_size, kv_dtype, options.layers);
  }
  if (num_blocks <= 0) {
    throw std::runtime_error("the CPU KV budget of " + std::to_string(kv.cpu_budget_bytes >> 20) +
                             " MiB holds no block; raise kv_memory_mb or num_kv_blocks");
  }
  return make_cpu_model(config, weights, kv_cache_shape{num_blocks, kv.block_size}, options.threads, kv_dtype,
                        options.layers);
}

}  // namespace troupe
