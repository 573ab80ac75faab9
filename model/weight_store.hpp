#pragma once
// The weights of one model: named, typed views into memory-mapped files or owned buffers.
// Names are canonical Hugging Face names ("model.layers.3.self_attn.q_proj.weight") whatever
// the file format, and q/k projections are always in the HF rotate-half layout.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/dtype.hpp"

namespace troupe {

struct weight_tensor {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;  // row-major, outermost first: a linear layer is [out_features, in_features]
  const std::byte* data = nullptr;
  size_t num_bytes = 0;
  // What a quantized checkpoint needs beyond the bytes' own type (filled by the HF loader's
  // unpackers; every consumer applies them, as weight_rows_f32 in model/weight_values.hpp does):
  std::vector<float> row_scales;     // [rows] or empty: value(r, c) = row_scales[r] * stored(r, c)
                                     //   (FP8 checkpoints' per-tensor and per-channel scales)
  std::vector<int32_t> input_order;  // [cols] or empty: stored column j holds value column
                                     //   input_order[j] (GPTQ act-order, groups made contiguous)
  // The buffer `data` lies in when the loader made these bytes (a GGUF "llama" q/k matrix
  // un-permuted into HF's row order); null for mapped bytes. weight_store::release_copies frees it.
  std::shared_ptr<const void> owned_copy;

  int64_t num_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t rows() const { return shape.empty() ? 1 : num_elements() / shape.back(); }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  // The stored bytes are the values themselves: no row scales, no column order.
  bool plain() const { return row_scales.empty() && input_order.empty(); }
};

class weight_store {
 public:
  // Keeps `owner` (a mapping or a buffer) alive as long as the store.
  void keep_alive(std::shared_ptr<const void> owner) { owners_.push_back(std::move(owner)); }
  void add(weight_tensor tensor);

  const weight_tensor* find(const std::string& name) const;
  // Throws std::runtime_error naming the missing tensor, or one whose copy was released.
  const weight_tensor& get(const std::string& name) const;
  // Frees the loader-made copies (owned_copy) of the named tensors, which a backend has put into
  // its own layout and no longer reads (the CPU model's repacked matrices: without this, a 1.1 B
  // Llama GGUF kept 60-112 MB of un-permuted q/k beside their repacked copies). Their data becomes
  // null and get() refuses them; names without a copy (mapped bytes) are left as they are.
  // Returns the bytes freed.
  size_t release_copies(const std::vector<std::string>& names);
  // Forgets every tensor not in `names` (a pipeline stage keeps only its layers'): their mapped
  // pages are never read, so they never become resident, and loader-made copies among them are
  // freed (the buffers a loader keeps alive for several tensors stay). Returns the bytes forgotten.
  size_t keep_only(const std::vector<std::string>& names);
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const std::map<std::string, weight_tensor>& tensors() const { return tensors_; }
  size_t total_bytes() const;

 private:
  std::map<std::string, weight_tensor> tensors_;
  std::vector<std::shared_ptr<const void>> owners_;
};

}  // namespace troupe
