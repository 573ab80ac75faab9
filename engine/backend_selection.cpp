#include "engine/backend_selection.hpp"

#include <stdexcept>

#include "kernels/cpu/cpu_model.hpp"

#ifdef TROUPE_HAVE_CUDA
#include "kernels/cuda/cuda_model.hpp"
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

void validate_backend_settings(const std::string& device, float gpu_memory_utilization, const std::string& cuda_dtype) {
  if (device != "cpu" && device != "cuda" && device != "auto") {
    throw std::runtime_error("device must be \"cpu\", \"cuda\" or \"auto\", got \"" + device + "\"");
  }
  if (!(gpu_memory_utilization > 0.0f && gpu_memory_utilization <= 1.0f)) {
    throw std::runtime_error("gpu_memory_utilization must be in (0, 1], got " + std::to_string(gpu_memory_utilization));
  }
  if (cuda_dtype != "f32" && cuda_dtype != "f16" && cuda_dtype != "bf16") {
    throw std::runtime_error("dtype must be f32, f16 or bf16, got \"" + cuda_dtype + "\"");
  }
}

device_choice choose_device(const std::string& requested) {
  validate_backend_settings(requested, 0.9f, "bf16");
  if (requested == "cpu") return {device_kind::cpu, ""};
  std::string why;
  if (gpu_answers(why)) return {device_kind::cuda, ""};
  if (requested == "cuda") return {device_kind::cpu, "--device cuda was asked for but CUDA is unavailable (" + why + "); running on the CPU"};
  return {device_kind::cpu, "device auto: " + why + "; running on the CPU"};
}

std::unique_ptr<model> make_backend_model(const model_config& config, const weight_store& weights,
                                          device_kind device, const kv_pool_request& kv,
                                          const backend_options& options) {
  if (device == device_kind::cuda) {
#ifdef TROUPE_HAVE_CUDA
    validate_backend_settings("cuda", options.gpu_memory_utilization, options.cuda_dtype);
    cuda_options cuda;
    cuda.gpu_memory_utilization = options.gpu_memory_utilization;
    cuda.activation = options.cuda_dtype == "f32" ? dtype::f32 : options.cuda_dtype == "f16" ? dtype::f16 : dtype::bf16;
    cuda.max_kv_blocks = kv.max_useful_blocks;
    cuda.nano_batches = options.nano_batches;
    // num_blocks 0 lets the CUDA model size its pool from the free memory left after the weights.
    return make_cuda_model(config, weights, kv_cache_shape{kv.num_blocks, kv.block_size}, cuda);
#else
    throw std::runtime_error("make_backend_model: this build has no CUDA backend");
#endif
  }
  int num_blocks = kv.num_blocks;
  if (num_blocks == 0) num_blocks = cpu_kv_blocks_for_budget(config, kv.cpu_budget_bytes, kv.block_size);
  if (num_blocks <= 0) {
    throw std::runtime_error("the CPU KV budget of " + std::to_string(kv.cpu_budget_bytes >> 20) +
                             " MiB holds no block; raise kv_memory_mb or num_kv_blocks");
  }
  return make_cpu_model(config, weights, kv_cache_shape{num_blocks, kv.block_size}, options.threads);
}

}  // namespace troupe
