// troupe quantize IN OUT --type TYPE: an HF directory or an F32/F16/BF16 GGUF file to a
// quantized GGUF file that llama.cpp and Troupe load (model/model_quantizer.hpp).

#include <chrono>

#include <spdlog/spdlog.h>

#include "cli/command_registry.hpp"
#include "model/model_quantizer.hpp"
#include "model/quantization_label.hpp"

namespace troupe::cli {
namespace {

// "412.5 MiB", "4.07 GiB".
std::string size_text(uint64_t bytes) {
  return bytes < (uint64_t{1} << 30) ? fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1u << 20))
                                     : fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1u << 30));
}

const bool registered = register_command([](CLI::App& parent) {
  auto options = std::make_shared<quantize_options>();
  auto dry_run = std::make_shared<bool>(false);
  CLI::App* app = parent.add_subcommand(
      "quantize", "quantize a model (HF directory or F32/F16/BF16 GGUF) into a GGUF file llama.cpp and Troupe load");
  app->add_option("input", options->input, "HF directory or .gguf file")->required();
  app->add_option("output", options->output, ".gguf file to write")->required();
  app->add_option("--type", options->type,
                  "a llama.cpp preset: " + quant::preset_names() +
                      " (any case; Q3_K, Q4_K, Q5_K are their _M mixes). The _S/_M/_L mixes give attn_v and ffn_down "
                      "more bits in some layers, as llama-quantize does; MXFP4 makes every matrix MXFP4")
      ->capture_default_str();
  app->add_flag("--pure", options->pure,
                "every matrix in the preset's type, no per-tensor mix (llama-quantize --pure)");
  app->add_option("--imatrix", options->importance,
                  "importance matrix from llama.cpp's imatrix tool (GGUF or legacy .dat): weighs each column's error")
      ->check(CLI::ExistingFile);
  app->add_option("--threads", options->num_threads, "quantizing threads (0: every core)")->capture_default_str();
  app->add_flag("--dry-run", *dry_run, "print each tensor's planned type and the sizes, write nothing");
  return command{
      app, [options, dry_run] {
        const auto started = std::chrono::steady_clock::now();
        model_quantizer quantizer(*options);
        std::map<dtype, int> planned;
        uint64_t planned_bytes = 0;
        int fallbacks = 0;
        for (const planned_tensor& t : quantizer.plan()) {
          int64_t elements = 1;
          for (int64_t d : t.dims) elements *= d;
          planned_bytes += row_bytes(t.to, elements);
          ++planned[t.to];
          if (t.fell_back) {
            ++fallbacks;
            spdlog::warn("{}: rows of {} values do not fit the preset's type; using {}", t.name, t.dims.front(),
                         ggml_style_name(t.to));
          }
          if (*dry_run) {
            std::printf("%-40s %-10s -> %-7s%s\n", t.name.c_str(), ggml_style_name(t.from).c_str(),
                        ggml_style_name(t.to).c_str(), t.weighted ? " (importance-weighted)" : "");
          }
        }
        if (*dry_run) {
          std::printf("%s: %s, %s of weights\n", std::string(quantizer.preset().name).c_str(),
                      describe_type_counts(planned).c_str(), size_text(planned_bytes).c_str());
          return 0;
        }
        const quantize_result result = quantizer.run();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        spdlog::info("wrote {} ({}): {}; {} -> {} of weights in {:.1f} s{}", options->output.string(),
                     quantizer.preset().name, describe_type_counts(result.tensors_per_type),
                     size_text(result.input_bytes), size_text(result.output_bytes), seconds,
                     fallbacks ? fmt::format(" ({} tensors fell back to a type their rows fit)", fallbacks) : "");
        return 0;
      }};
});

}  // namespace
}  // namespace troupe::cli
