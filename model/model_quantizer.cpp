#include "model/model_quantizer.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>

#include "model/loader/gguf_file.hpp"
#include "model/loader/gguf_model_loader.hpp"
#include "model/loader/gguf_model_metadata.hpp"
#include "model/loader/gguf_tensor_names.hpp"
#include "model/loader/gguf_tokenizer_metadata.hpp"
#include "model/loader/gguf_writer.hpp"
#include "model/loader/hf_config.hpp"
#include "model/loader/hf_quantization.hpp"
#include "model/loader/hf_tensor_forms.hpp"
#include "model/loader/hf_weights.hpp"
#include "model/loader/importance_matrix.hpp"
#include "model/loader/progress_bar.hpp"
#include "model/loader/rope_permutation.hpp"
#include "model/loader/safetensors_file.hpp"
#include "model/loader/tokenizer_sources.hpp"
#include "model/model_tensors.hpp"
#include "model/quant/dequantize.hpp"
#include "model/quant/quantize.hpp"
#include "model/quantization_label.hpp"
#include "model/weight_values.hpp"

namespace troupe {
namespace {

// GGUF's general.quantization_version: the block layouts of ggml's current quantization (2).
constexpr uint32_t quantization_version = 2;

// A thread's share of a tensor is worth handing out only with this many values.
constexpr int64_t min_values_per_chunk = 1 << 16;

bool plain_float(dtype type) { return type == dtype::f32 || type == dtype::f16 || type == dtype::bf16; }

int metadata_int(const gguf_file& file, const std::string& key) {
  // Some architectures store per-layer arrays here; the rules only need the common value.
  const gguf_value* value = file.find(key);
  if (!value) return 0;
  if (value->value.is_number_integer()) return value->value.get<int>();
  if (value->value.is_array() && !value->value.empty() && value->value.front().is_number_integer()) {
    return value->value.front().get<int>();
  }
  return 0;
}

}  // namespace

struct model_quantizer::input_tensor {
  std::string name;           // GGUF name
  std::vector<int64_t> dims;  // innermost first
  dtype type = dtype::f32;
  const std::byte* data = nullptr;
  size_t num_bytes = 0;

  int64_t columns() const { return dims.front(); }
  int64_t num_elements() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
};

struct model_quantizer::source {
  gguf_writer writer;  // the output's metadata so far; run() adds the tensors
  std::vector<input_tensor> tensors;
  quant::model_facts facts;
  std::vector<std::shared_ptr<const void>> owners;  // mappings and re-laid-out buffers
  weight_store hf_weights;                          // an HF input's mapped tensors

  static std::unique_ptr<source> open_gguf(const std::filesystem::path& path);
  static std::unique_ptr<source> open_hf(const std::filesystem::path& path);
};

std::unique_ptr<model_quantizer::source> model_quantizer::source::open_gguf(const std::filesystem::path& path) {
  const gguf_file file = gguf_file::open(path);
  auto in = std::make_unique<source>();
  in->owners.push_back(file.mapping());
  for (const std::string& key : file.keys()) {
    // A split file's keys describe its shards; the output is one file.
    if (key.rfind("split.", 0) == 0) continue;
    in->writer.set(key, *file.find(key));
  }
  const std::string arch = file.get_string("general.architecture");
  in->facts.num_layers = metadata_int(file, arch + ".block_count");
  in->facts.num_heads = metadata_int(file, arch + ".attention.head_count");
  in->facts.num_kv_heads = metadata_int(file, arch + ".attention.head_count_kv");
  if (in->facts.num_kv_heads == 0) in->facts.num_kv_heads = in->facts.num_heads;
  in->facts.num_experts = metadata_int(file, arch + ".expert_count");
  in->facts.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  in->facts.llama_70b = arch == "llama" && in->facts.num_layers == 80 && in->facts.num_heads != in->facts.num_kv_heads;
  for (const gguf_tensor_info& info : file.tensors()) {
    const auto type = info.element_type();
    if (!type) {
      throw std::runtime_error("GGUF file '" + path.string() + "': tensor '" + info.name + "' has type " +
                               ggml_type_name(info.type) + ", which Troupe cannot read (it reads " +
                               loadable_ggml_type_names() + ")");
    }
    in->tensors.push_back({info.name, info.dims, *type, info.data, info.num_bytes});
  }
  return in;
}

std::unique_ptr<model_quantizer::source> model_quantizer::source::open_hf(const std::filesystem::path& path) {
  auto in = std::make_unique<source>();
  // Read as `troupe generate` reads it: quantized checkpoints unpacked, checkpoint forms adapted
  // to the canonical tensors, so every architecture and checkpoint format Troupe runs converts.
  const model_config config = load_hf_config(path);
  add_hf_weights(read_safetensors_directory(path), read_hf_quantization(path), in->hf_weights);
  adapt_hf_tensors(config, in->hf_weights);
  validate_weights(config, in->hf_weights, (path / "config.json").string());
  std::string name = path.filename().string();
  if (name.empty()) name = path.parent_path().filename().string();
  add_model_metadata(in->writer, config, name);
  add_tokenizer_metadata(in->writer, load_tokenizer_sources(path));
  in->facts.num_layers = config.num_layers;
  in->facts.num_heads = config.num_heads;
  in->facts.num_kv_heads = config.num_kv_heads;
  in->facts.num_experts = config.moe.num_experts;
  in->facts.tied_embeddings = config.tie_word_embeddings;
  in->facts.llama_70b =
      gguf_architecture_name(config) == "llama" && config.num_layers == 80 && config.num_heads != config.num_kv_heads;

  for (const gguf_tensor_layout& layout : gguf_tensor_layouts(config)) {
    const weight_tensor& first = in->hf_weights.get(layout.parts.front());
    const bool one_d = layout.shape.size() == 1 || layout.gguf_1d;
    std::vector<int64_t> dims =
        one_d ? std::vector<int64_t>{first.num_elements() * static_cast<int64_t>(layout.parts.size())}
              : std::vector<int64_t>{layout.shape.rbegin(), layout.shape.rend()};
    const bool as_stored = layout.parts.size() == 1 && !layout.norm_plus_one && first.row_scales.empty() &&
                           first.input_order.empty() && (layout.permuted_heads == 0 || !is_quantized(first.type));
    if (as_stored) {
      input_tensor t{layout.gguf_name, std::move(dims), first.type, first.data, first.num_bytes};
      if (layout.permuted_heads > 0) {
        // GGUF keeps Llama's q/k rows in the interleaved RoPE layout: move them once, whole rows.
        auto buffer = std::make_shared<std::vector<std::byte>>(first.num_bytes);
        const int64_t rows = first.shape.front();
        permute_rows_hf_to_gguf(first.data, buffer->data(), rows, first.num_bytes / static_cast<size_t>(rows),
                                layout.permuted_heads);
        t.data = buffer->data();
        in->owners.push_back(buffer);
      }
      in->tensors.push_back(std::move(t));
      continue;
    }
    // Stacked experts, fused parts, (1 + w) norms, row scales or a column order: the values
    // (weight_rows_f32, the one definition of what a quantized checkpoint means) in f32.
    auto values = std::make_shared<std::vector<float>>();  // [rows of every part][columns]
    for (const std::string& part_name : layout.parts) {
      const weight_tensor& part = in->hf_weights.get(part_name);
      const size_t at = values->size();
      values->resize(at + static_cast<size_t>(part.num_elements()));
      weight_rows_f32(part, 0, part.rows(), values->data() + at);
    }
    if (layout.permuted_heads > 0) {
      std::vector<float> permuted(values->size());
      const int64_t rows = layout.shape.front();
      permute_rows_hf_to_gguf(reinterpret_cast<const std::byte*>(values->data()),
                              reinterpret_cast<std::byte*>(permuted.data()), rows,
                              values->size() / static_cast<size_t>(rows) * sizeof(float), layout.permuted_heads);
      values->swap(permuted);
    }
    if (layout.norm_plus_one) {
      for (float& v : *values) v += 1.0f;
    }
    in->tensors.push_back({layout.gguf_name, std::move(dims), dtype::f32,
                           reinterpret_cast<const std::byte*>(values->data()), values->size() * sizeof(float)});
    in->owners.push_back(values);
  }
  for (gguf_extra_tensor& extra : gguf_rope_tensors(config)) {
    auto values = std::make_shared<std::vector<float>>(std::move(extra.values));
    in->tensors.push_back({extra.name,
                           {static_cast<int64_t>(values->size())},
                           dtype::f32,
                           reinterpret_cast<const std::byte*>(values->data()),
                           values->size() * sizeof(float)});
    in->owners.push_back(values);
  }
  return in;
}

model_quantizer::model_quantizer(quantize_options options) : options_(std::move(options)) {
  auto preset = quant::find_preset(options_.type);
  if (!preset) {
    throw std::runtime_error("unknown quantization type '" + options_.type + "' (expected one of " +
                             quant::preset_names() + "; Q3_K, Q4_K and Q5_K mean their _M mixes)");
  }
  preset_ = *preset;
  if (options_.input.empty()) throw std::runtime_error("the input model is required (an HF directory or a .gguf file)");
  if (!std::filesystem::exists(options_.input)) {
    throw std::runtime_error("input model '" + options_.input.string() + "' does not exist");
  }
  source_ = std::filesystem::is_directory(options_.input) ? source::open_hf(options_.input)
                                                          : source::open_gguf(options_.input);

  std::unique_ptr<importance_matrix> importance;
  if (!options_.importance.empty()) {
    importance = std::make_unique<importance_matrix>(load_importance_matrix(options_.importance));
  } else if (preset_.needs_importance) {
    throw std::runtime_error(std::string(preset_.name) + " needs an importance matrix (--imatrix FILE): its 2-bit " +
                             "tensors are not usable without one");
  }
  source_->facts.has_importance = importance != nullptr;

  for (const input_tensor& t : source_->tensors) {
    const quant::tensor_choice choice = quant::choose_tensor_type(
        preset_, options_.pure, source_->facts, {t.name, t.columns(), static_cast<int>(t.dims.size()), t.type});
    planned_tensor planned{t.name, t.dims, t.type, choice.type, choice.fell_back, false};
    if (planned.to != planned.from && !plain_float(planned.from)) {
      throw std::runtime_error("tensor '" + t.name + "' of '" + options_.input.string() + "' is already " +
                               ggml_style_name(t.type) + ": quantize from the F32/F16/BF16 model (requantizing loses " +
                               "quality and is not offered)");
    }
    if (importance && is_quantized(planned.to) && planned.to != planned.from) {
      if (const std::vector<float>* entry = importance->find(t.name)) {
        int64_t matrices = 1;
        for (size_t d = 2; d < t.dims.size(); ++d) matrices *= t.dims[d];
        if (static_cast<int64_t>(entry->size()) == t.columns() * matrices) {
          planned.weighted = true;
        } else if (t.name == "token_embd.weight") {
          // llama.cpp skips a mismatched token_embd entry too: it is read by row, not multiplied.
          spdlog::warn("importance entry of {} has {} values, expected {}; quantizing it unweighted", t.name,
                       entry->size(), t.columns() * matrices);
        } else {
          throw std::runtime_error("importance matrix '" + options_.importance.string() + "': entry '" + t.name +
                                   "' has " + std::to_string(entry->size()) + " values, expected " +
                                   std::to_string(t.columns() * matrices) + " (one per column" +
                                   (matrices > 1 ? " of each of " + std::to_string(matrices) + " matrices)" : ")") +
                                   "; was it computed for another model?");
        }
      }
    }
    plan_.push_back(std::move(planned));
  }

  gguf_writer& writer = source_->writer;
  writer.set("general.quantization_version", gguf_value::u32(quantization_version));
  writer.set("general.file_type", gguf_value::u32(preset_.file_type));
  if (importance) {
    // What llama-quantize records of an imatrix.
    writer.set("quantize.imatrix.file", gguf_value::string(options_.importance.string()));
    if (!importance->datasets.empty())
      writer.set("quantize.imatrix.dataset", gguf_value::string(importance->datasets.front()));
    writer.set("quantize.imatrix.entries_count", gguf_value::u32(static_cast<uint32_t>(importance->entries.size())));
    if (importance->chunk_count > 0) {
      writer.set("quantize.imatrix.chunks_count", gguf_value::u32(static_cast<uint32_t>(importance->chunk_count)));
    }
  }
  // The entries the plan uses, kept with the input.
  if (importance) {
    auto kept = std::make_shared<importance_matrix>(std::move(*importance));
    source_->owners.push_back(kept);
    importance_ = kept.get();
  }
}

model_quantizer::~model_quantizer() = default;

quantize_result model_quantizer::run() {
  const int num_threads = std::max(
      1, options_.num_threads > 0 ? options_.num_threads : static_cast<int>(std::thread::hardware_concurrency()));
  uint64_t total_values = 0;
  for (const input_tensor& t : source_->tensors) total_values += static_cast<uint64_t>(t.num_elements());
  progress_bar bar("quantizing to " + std::string(preset_.name), total_values, options_.show_progress);

  quantize_result result;
  gguf_writer& writer = source_->writer;
  for (size_t i = 0; i < plan_.size(); ++i) {
    const planned_tensor& planned = plan_[i];
    const input_tensor& in = source_->tensors[i];
    const size_t out_bytes = row_bytes(planned.to, in.num_elements());
    result.input_bytes += in.num_bytes;
    result.output_bytes += out_bytes;
    ++result.tensors_per_type[planned.to];
    const float* importance = planned.weighted ? importance_->find(in.name)->data() : nullptr;
    writer.add_tensor(planned.name, gguf_type_of(planned.to), planned.dims, out_bytes,
                      [this, &planned, &in, importance, num_threads, &bar](std::byte* out) {
                        spdlog::debug("{} [{}] {} -> {}", planned.name, shape_string(planned.dims),
                                      ggml_style_name(planned.from), ggml_style_name(planned.to));
                        quantize_tensor(in, planned, importance, num_threads, out);
                        bar.advance(static_cast<uint64_t>(in.num_elements()));
                      });
  }

  // Write beside the target and rename at the end: a failure leaves no half-written model.
  std::filesystem::path partial = options_.output;
  partial += ".part";
  try {
    writer.write(partial);
    std::filesystem::rename(partial, options_.output);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw;
  }
  bar.finish();
  return result;
}

void model_quantizer::quantize_tensor(const input_tensor& in, const planned_tensor& planned, const float* importance,
                                      int num_threads, std::byte* out) const {
  if (planned.from == planned.to) {
    std::memcpy(out, in.data, in.num_bytes);
    return;
  }
  const int64_t columns = in.columns();
  const int64_t rows = in.num_elements() / columns;
  const int64_t rows_per_matrix = in.dims.size() > 1 ? in.dims[1] : 1;
  const size_t in_row = row_bytes(in.type, columns), out_row = row_bytes(planned.to, columns);
  const int64_t rows_per_chunk = std::max<int64_t>(1, min_values_per_chunk / columns);

  std::atomic<int64_t> next_row{0};
  std::mutex failure_mutex;
  std::string failure;
  auto work = [&] {
    std::vector<float> values(static_cast<size_t>(columns));  // [columns] one row in f32
    for (;;) {
      const int64_t begin = next_row.fetch_add(rows_per_chunk);
      if (begin >= rows) return;
      for (int64_t r = begin; r < std::min(rows, begin + rows_per_chunk); ++r) {
        quant::dequantize_row(in.type, in.data + r * in_row, values.data(), columns);
        for (int64_t c = 0; c < columns; ++c) {
          if (!std::isfinite(values[static_cast<size_t>(c)])) {
            std::lock_guard lock(failure_mutex);
            if (failure.empty()) {
              failure = "tensor '" + in.name + "' of '" + options_.input.string() + "' holds " +
                        std::to_string(values[static_cast<size_t>(c)]) + " at row " + std::to_string(r) + ", column " +
                        std::to_string(c) + ": a model with non-finite weights cannot be quantized";
            }
            next_row = rows;
            return;
          }
        }
        const float* weights = importance ? importance + (r / rows_per_matrix) * columns : nullptr;
        quant::quantize_row(planned.to, values.data(), columns, out + r * out_row, weights);
      }
    }
  };
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  const int workers = static_cast<int>(std::min<int64_t>(num_threads, chunks));
  std::vector<std::thread> threads;
  for (int t = 1; t < workers; ++t) threads.emplace_back(work);
  work();
  for (auto& thread : threads) thread.join();
  if (!failure.empty()) throw std::runtime_error(failure);
}

}  // namespace troupe
