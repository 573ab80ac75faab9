#include "model/loader/hf_weights.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <set>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "model/loader/fp8_checkpoint.hpp"
#include "model/loader/int4_blocks.hpp"
#include "model/loader/int4_checkpoints.hpp"

namespace troupe {
namespace {

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// The tensor that marks a quantized layer, and the companions its unpacker reads, per layout.
struct layout_tensors {
  std::string_view marker;
  std::vector<std::string_view> companions;
};

layout_tensors tensors_of(hf_quant_layout layout) {
  switch (layout) {
    case hf_quant_layout::fp8: return {".weight", {".weight_scale", ".weight_scale_inv", ".input_scale"}};
    case hf_quant_layout::awq: return {".qweight", {".qzeros", ".scales"}};
    case hf_quant_layout::gptq: return {".qweight", {".qzeros", ".scales", ".g_idx"}};
    case hf_quant_layout::packed_int4:
      return {".weight_packed", {".weight_scale", ".weight_zero_point", ".weight_g_idx", ".weight_shape"}};
  }
  return {};
}

// Scales of activations and of a quantized KV cache: meaningful to engines that compute in FP8,
// not to Troupe's f32 activations and its own KV-cache dtype.
bool is_activation_scale(std::string_view name) {
  for (std::string_view suffix :
       {".input_scale", ".output_scale", ".k_scale", ".v_scale", ".q_scale", ".prob_scale", ".kv_scale"}) {
    if (ends_with(name, suffix)) return true;
  }
  return false;
}

unpacked_weight unpack_layer(const safetensors_checkpoint& checkpoint, const hf_quantization& q,
                             const std::string& prefix) {
  switch (q.layout) {
    case hf_quant_layout::fp8: return read_fp8_layer(checkpoint, prefix, q);
    case hf_quant_layout::awq: return repack_int4(read_awq_layer(checkpoint, prefix, q));
    case hf_quant_layout::gptq: return repack_int4(read_gptq_layer(checkpoint, prefix, q));
    case hf_quant_layout::packed_int4: return repack_int4(read_packed_int4_layer(checkpoint, prefix, q));
  }
  return {};
}

// Unpacks the layers on every hardware thread (each layer is independent: it reads the mapping
// and fills buffers of its own). The first failure in file order is rethrown, whatever order the
// threads met them in.
std::vector<unpacked_weight> unpack_layers(const safetensors_checkpoint& checkpoint, const hf_quantization& q,
                                           const std::vector<std::string>& prefixes) {
  std::vector<unpacked_weight> weights(prefixes.size());
  std::vector<std::exception_ptr> errors(prefixes.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < prefixes.size(); i = next++) {
      try {
        weights[i] = unpack_layer(checkpoint, q, prefixes[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t num_threads = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), prefixes.size());
  std::vector<std::thread> threads;
  for (size_t t = 1; t < num_threads; ++t) threads.emplace_back(work);
  work();
  for (auto& thread : threads) thread.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return weights;
}

void add_plain(const safetensors_checkpoint& checkpoint, weight_store& store) {
  for (const auto& tensor : checkpoint.tensors) {
    for (std::string_view suffix : {".qweight", ".weight_packed", ".weight_scale", ".weight_scale_inv"}) {
      if (ends_with(tensor.name, suffix)) {
        throw std::runtime_error("tensor " + tensor.name + " of file " + tensor.file.string() +
                                 " belongs to a quantized checkpoint, but its config.json has no quantization_config");
      }
    }
    store.add(tensor.as_weight());
  }
}

}  // namespace

void add_hf_weights(const safetensors_checkpoint& checkpoint, const std::optional<hf_quantization>& quantization,
                    weight_store& store) {
  for (const auto& mapping : checkpoint.mappings) store.keep_alive(mapping);
  if (!quantization) return add_plain(checkpoint, store);
  const hf_quantization& q = *quantization;
  const layout_tensors layout = tensors_of(q.layout);
  std::vector<std::string> prefixes;  // the quantized layers, in file order
  std::set<std::string> consumed;
  for (const auto& tensor : checkpoint.tensors) {
    if (!ends_with(tensor.name, layout.marker)) continue;
    if (q.layout == hf_quant_layout::fp8 && tensor.type_name != "F8_E4M3") continue;  // a layer left unquantized
    prefixes.push_back(tensor.name.substr(0, tensor.name.size() - layout.marker.size()));
    consumed.insert(tensor.name);
    for (std::string_view companion : layout.companions) consumed.insert(prefixes.back() + std::string(companion));
  }
  const std::vector<unpacked_weight> weights = unpack_layers(checkpoint, q, prefixes);
  std::map<std::string, int> num_by_type;
  int num_reordered = 0;
  for (const unpacked_weight& weight : weights) {
    ++num_by_type[std::string(dtype_name(weight.tensor.type))];
    if (!weight.tensor.input_order.empty()) ++num_reordered;
    if (weight.storage) store.keep_alive(weight.storage);
    store.add(weight.tensor);
  }
  for (const auto& tensor : checkpoint.tensors) {
    if (consumed.count(tensor.name)) continue;
    if (is_activation_scale(tensor.name)) continue;
    for (std::string_view companion : layout.companions) {
      if (ends_with(tensor.name, companion)) {
        const std::string prefix = tensor.name.substr(0, tensor.name.size() - companion.size());
        throw std::runtime_error("tensor " + tensor.name + " of file " + tensor.file.string() + " has no quantized " +
                                 prefix + std::string(layout.marker) + " beside it (a " + q.method +
                                 " layer needs both)");
      }
    }
    store.add(tensor.as_weight());
  }
  std::string counts;
  for (const auto& [type, count] : num_by_type)
    counts += (counts.empty() ? "" : ", ") + type + ": " + std::to_string(count);
  spdlog::info("{}; quantized layers loaded as {}{}", describe(q), counts.empty() ? "none" : counts,
               num_reordered ? " (" + std::to_string(num_reordered) + " with act-order columns)" : "");
}

}  // namespace troupe
