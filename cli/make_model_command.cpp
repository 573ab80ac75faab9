// troupe make-model: a small random model of a real architecture, as an HF directory and a GGUF
// file holding the same weights, for tests and benchmarks.

#include <spdlog/spdlog.h>

#include "cli/command_registry.hpp"
#include "model/model_maker.hpp"

namespace troupe::cli {
namespace {

const bool registered = register_command([](CLI::App& parent) {
  auto options = std::make_shared<model_maker_options>();
  auto type_name = std::make_shared<std::string>("f32");
  CLI::App* app = parent.add_subcommand("make-model", "write a random model (HF directory + model.gguf) of a real architecture");
  app->add_option("--arch", options->arch, "llama | llama3 | mistral | qwen2 | qwen3")
      ->check(CLI::IsMember({"llama", "llama3", "mistral", "qwen2", "qwen3"}))
      ->capture_default_str();
  app->add_option("--hidden-size", options->hidden_size)->capture_default_str();
  app->add_option("--intermediate-size", options->intermediate_size)->capture_default_str();
  app->add_option("--layers", options->num_layers)->capture_default_str();
  app->add_option("--heads", options->num_heads)->capture_default_str();
  app->add_option("--kv-heads", options->num_kv_heads)->capture_default_str();
  app->add_option("--head-dim", options->head_dim, "default hidden-size / heads");
  app->add_option("--vocab-size", options->vocab_size, "must equal the tokenizer's vocabulary size (default: that size)");
  app->add_option("--max-position-embeddings", options->max_position_embeddings)->capture_default_str();
  app->add_flag("--tie-word-embeddings", options->tie_word_embeddings, "share embeddings and lm_head");
  app->add_option("--dtype", *type_name,
                  "f32 | f16 | bf16, or any GGUF type (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k..q6_k, iq4_nl, iq4_xs, mxfp4): "
                  "every matrix of the GGUF in that type (rows that do not fit its blocks in f16), the HF copy in f16")
      ->check([](const std::string& name) -> std::string {
        const auto type = dtype_from_name(name);
        return type && *type != dtype::fp8_e4m3 ? "" : "unknown or non-GGUF dtype '" + name + "'";
      })
      ->capture_default_str();
  app->add_option("--tokenizer", options->tokenizer, "HF directory, tokenizer.json or .gguf")->required();
  app->add_option("--seed", options->seed)->capture_default_str();
  app->add_option("--init-std", options->init_stddev, "standard deviation of the random matrices")->capture_default_str();
  app->add_option("--norm-jitter", options->norm_jitter, "norm weights are 1 +- this")->capture_default_str();
  app->add_option("--out", options->out, "output directory")->required();
  return command{app, [options, type_name] {
                   options->type = *dtype_from_name(*type_name);
                   made_model made = make_model(*options);
                   spdlog::info("wrote {} (HF) and {}: {} layers, hidden {}, vocab {}", made.hf_dir.string(),
                                made.gguf_path.string(), made.config.num_layers, made.config.hidden_size,
                                made.config.vocab_size);
                   return 0;
                 }};
});

}  // namespace
}  // namespace troupe::cli
