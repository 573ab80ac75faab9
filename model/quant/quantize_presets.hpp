#pragma once
// The file types people ask llama-quantize for ("Q4_K_M", "Q5_K_S", "IQ4_XS"...) and the
// per-tensor choice of types each makes: 1-D tensors and norms stay as they are, the output
// projection (and tied embeddings) get Q6_K, and depending on the preset some layers' attn_v and
// ffn_down get more bits. The rules are llama.cpp's (src/llama-quant.cpp), so a file quantized
// here holds the tensor types a llama.cpp-quantized file of the same preset holds; tests check
// the choice against llama.cpp's own quantizer.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "model/dtype.hpp"

namespace troupe::quant {

struct quantize_preset {
  std::string_view name;          // as llama-quantize spells it: "Q4_K_M"
  uint32_t file_type;             // GGUF general.file_type (llama.cpp's llama_ftype number)
  dtype base;                     // the type most tensors get
  bool pure = false;              // every quantizable tensor gets `base` (no per-tensor rules)
  bool needs_importance = false;  // refused without an importance matrix (Q2_K_S)
};

// The preset named `name`, in any case: llama-quantize's names and aliases (Q4_K is Q4_K_M),
// plus MXFP4 (every matrix MXFP4; llama.cpp only offers MXFP4 for MoE experts). Any other
// GGUF type name given is not a preset: nullopt.
std::optional<quantize_preset> find_preset(std::string_view name);
// "Q4_0, Q4_1, ..., F32": every preset name, for help and errors.
std::string preset_names();
// The preset whose general.file_type is `file_type`, if any (to name a file's quantization).
std::optional<quantize_preset> preset_of_file_type(uint32_t file_type);

// What the rules look at besides the tensor itself.
struct model_facts {
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int num_experts = 0;
  bool tied_embeddings = false;  // no output.weight: token_embd.weight is the output projection too
  bool llama_70b = false;        // llama.cpp's LLM_TYPE_70B (80 layers, GQA): attn_v gets more bits
  bool has_importance = false;   // an importance matrix was given
};

struct tensor_facts {
  std::string name;     // GGUF name: "blk.3.attn_v.weight"
  int64_t columns = 0;  // elements per row (GGUF ne[0])
  int num_dims = 0;
  dtype current = dtype::f32;  // what the input file holds
};

struct tensor_choice {
  dtype type;
  bool fell_back = false;  // the rule's type did not fit the rows (ne[0] not a multiple of its block)
};

// Whether llama.cpp quantizes a tensor of this name and rank at all (2-D and up, a ".weight",
// not a norm, not a MoE router...); the others keep their type.
bool is_quantizable(const std::string& name, int num_dims);

// The type `tensor` gets under `preset` (`pure`: the preset's base type wherever it fits).
tensor_choice choose_tensor_type(const quantize_preset& preset, bool pure, const model_facts& model,
                                 const tensor_facts& tensor);

}  // namespace troupe::quant
