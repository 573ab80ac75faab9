#include "model/loader/model_loader.hpp"

#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "model/loader/dummy_weights.hpp"
#include "model/loader/gguf_file.hpp"
#include "model/loader/gguf_model_loader.hpp"
#include "model/loader/hf_config.hpp"
#include "model/loader/hf_quantization.hpp"
#include "model/loader/hf_tensor_forms.hpp"
#include "model/loader/hf_weights.hpp"
#include "model/loader/progress_bar.hpp"
#include "model/loader/safetensors_file.hpp"
#include "model/model_tensors.hpp"
#include "model/quantization_label.hpp"
#include "model/weight_finiteness.hpp"

namespace troupe {
namespace {

// Bigger models get a progress bar even when stderr is not a terminal.
constexpr uint64_t big_model_bytes = uint64_t{1} << 30;
constexpr size_t page_bytes = 4096;

// Reads one byte per page so the weights are resident before the first step, with a bar.
void prefault(const weight_store& weights, bool show_progress) {
  const uint64_t total = weights.total_bytes();
  progress_bar bar("loading weights", total, show_progress && total >= big_model_bytes);
  volatile unsigned char sink = 0;
  for (const auto& [name, tensor] : weights.tensors()) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(tensor.data);
    for (size_t offset = 0; offset < tensor.num_bytes; offset += page_bytes) sink = sink + bytes[offset];
    bar.advance(tensor.num_bytes);
  }
  bar.finish();
}

}  // namespace

load_format detect_format(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) throw std::runtime_error("model path '" + path.string() + "' does not exist");
  if (std::filesystem::is_directory(path)) {
    if (std::filesystem::exists(path / "model.safetensors") ||
        std::filesystem::exists(path / "model.safetensors.index.json")) {
      return load_format::safetensors;
    }
    for (const auto& entry : std::filesystem::directory_iterator(path)) {
      if (entry.path().extension() == ".gguf") {
        throw std::runtime_error("model directory '" + path.string() +
                                 "' has no safetensors weights; to load the GGUF file pass it directly: '" +
                                 entry.path().string() + "'");
      }
    }
    throw std::runtime_error("model directory '" + path.string() +
                             "' has neither model.safetensors nor model.safetensors.index.json");
  }
  if (path.extension() == ".gguf") return load_format::gguf;
  throw std::runtime_error("cannot tell the format of '" + path.string() +
                           "': expected an HF directory or a .gguf file");
}

load_format parse_load_format(std::string_view name) {
  if (name == "auto") return load_format::auto_detect;
  if (name == "safetensors") return load_format::safetensors;
  if (name == "gguf") return load_format::gguf;
  if (name == "dummy") return load_format::dummy;
  throw std::runtime_error("unknown load format '" + std::string(name) +
                           "' (expected auto, safetensors, gguf or dummy)");
}

namespace {

// A pipeline stage forgets the other stages' tensors before anything reads them; what is kept
// must fit the memory budget, checked before a byte of it is read.
void keep_what_this_process_holds(loaded_model& model, const load_options& options) {
  const layer_range layers = options.layers.resolved(model.config.num_layers);
  check_layer_range(layers, model.config.num_layers);
  if (!layers.whole(model.config.num_layers)) {
    const size_t forgotten = model.weights.keep_only(stage_tensor_names(model.config, layers));
    spdlog::info("pipeline stage of layers {}: {:.1f} MiB of other stages' weights left unread",
                 layer_range_text(layers), static_cast<double>(forgotten) / (1 << 20));
  }
  const uint64_t needed = model.weights.total_bytes();
  if (options.max_weight_bytes > 0 && needed > options.max_weight_bytes) {
    auto mib = [](uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); };
    throw std::runtime_error("the weights of layers " + layer_range_text(layers) + " need " + mib(needed) + " (" +
                             std::to_string(needed) + " bytes), above the " + mib(options.max_weight_bytes) +
                             " this process may hold" +
                             (options.budget_note.empty() ? "" : " (" + options.budget_note + ")") +
                             "; cut the model into pipeline stages (troupe stage --layers) or raise the budget");
  }
}

}  // namespace

loaded_model load_model(const load_options& options) try {
  loaded_model model;
  model.source = options.path;
  load_format format = options.format == load_format::auto_detect ? detect_format(options.path) : options.format;
  std::optional<uint32_t> file_type;  // a GGUF's general.file_type
  switch (format) {
    case load_format::dummy: {
      model.config = load_hf_config(options.path);
      check_dummy_weights_fit(model.config, options.dummy_dtype, "'" + options.path.string() + "'");
      model.weights = make_dummy_weights(model.config, options.dummy_dtype, options.dummy_seed);
      keep_what_this_process_holds(model, options);
      break;
    }
    case load_format::safetensors: {
      model.config = load_hf_config(options.path);
      add_hf_weights(read_safetensors_directory(options.path), read_hf_quantization(options.path), model.weights);
      adapt_hf_tensors(model.config, model.weights);
      validate_weights(model.config, model.weights, (options.path / "config.json").string());
      keep_what_this_process_holds(model, options);
      check_weights_finite(model.weights, options.path.string());
      break;
    }
    case load_format::gguf: {
      gguf_file file = gguf_file::open(options.path);
      model.config = gguf_model_config(file);
      load_gguf_weights(file, model.config, model.weights);
      if (auto type = file.find_int("general.file_type")) file_type = static_cast<uint32_t>(*type);
      validate_weights(model.config, model.weights, "the metadata of " + options.path.string());
      keep_what_this_process_holds(model, options);
      check_weights_finite(model.weights, options.path.string());
      break;
    }
    case load_format::auto_detect: break;
  }
  prefault(model.weights, options.show_progress);
  model.quantization = quantization_label(model.weights, file_type);
  spdlog::info("weights of '{}' ({}): {}; {:.1f} MiB", options.path.string(), model.quantization,
               describe_type_counts(tensor_type_counts(model.weights)),
               static_cast<double>(model.weights.total_bytes()) / (1 << 20));
  return model;
} catch (const std::bad_alloc&) {
  // What was being loaded, rather than a bare "std::bad_alloc" from the command (issue 25).
  throw std::runtime_error("out of memory while loading the model '" + options.path.string() +
                           "' (the weights and their tables do not fit in this machine's memory)");
}

}  // namespace troupe
