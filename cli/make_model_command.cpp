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
  auto norm_topk = std::make_shared<std::string>("");
  auto attn_softcap = std::make_shared<float>(-1.0f);
  auto final_softcap = std::make_shared<float>(-1.0f);
  CLI::App* app =
      parent.add_subcommand("make-model", "write a random model (HF directory + model.gguf) of a real architecture");
  app->add_option("--arch", options->arch,
                  "llama | llama3 | mistral | qwen2 | qwen3 | mixtral | qwen2_moe | qwen3_moe | gpt_oss | gemma2 | "
                  "gemma3 | phi3")
      ->check(CLI::IsMember({"llama", "llama3", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe",
                             "gpt_oss", "gemma2", "gemma3", "phi3"}))
      ->capture_default_str();
  app->add_option("--hidden-size", options->hidden_size)->capture_default_str();
  app->add_option("--intermediate-size", options->intermediate_size)->capture_default_str();
  app->add_option("--layers", options->num_layers)->capture_default_str();
  app->add_option("--heads", options->num_heads)->capture_default_str();
  app->add_option("--kv-heads", options->num_kv_heads)->capture_default_str();
  app->add_option("--head-dim", options->head_dim, "default hidden-size / heads");
  app->add_option("--rotary-dim", options->rotary_dim, "dimensions of each head RoPE turns (default head-dim)");
  app->add_option("--vocab-size", options->vocab_size,
                  "must equal the tokenizer's vocabulary size (default: that size)");
  app->add_option("--max-position-embeddings", options->max_position_embeddings)->capture_default_str();
  app->add_flag("--tie-word-embeddings", options->tie_word_embeddings,
                "share embeddings and lm_head (Gemma always does)");
  app->add_option("--experts", options->num_experts, "routed experts per layer (MoE architectures; default 8)");
  app->add_option("--experts-per-token", options->experts_per_token, "top-k experts per token (default 2)");
  app->add_option("--expert-intermediate-size", options->expert_intermediate_size,
                  "each expert's width (default intermediate-size / 2 for Qwen MoE, intermediate-size otherwise)");
  app->add_option("--shared-expert-intermediate-size", options->shared_expert_intermediate_size,
                  "Qwen2-MoE's shared expert width (default intermediate-size)");
  app->add_option("--norm-topk-prob", *norm_topk,
                  "renormalise the top-k routing weights: true | false (Qwen MoE; default false for "
                  "qwen2_moe, true for qwen3_moe)")
      ->check(CLI::IsMember({"true", "false"}));
  app->add_option("--sliding-window", options->sliding_window,
                  "window of the sliding layers (Gemma 2: 4096, Gemma 3: 512, gpt-oss: 128; mistral: every layer "
                  "slides, default none)");
  app->add_option("--attn-softcap", *attn_softcap, "Gemma 2's attention logit soft-capping (default 50; 0: none)");
  app->add_option("--final-softcap", *final_softcap, "final logit soft-capping (Gemma 2: 30; 0: none)");
  app->add_flag("--attention-sinks", options->attention_sinks,
                "gpt-oss: random attention sinks (default: -infinity, inert)");
  app->add_option("--rope-scaling", options->rope_scaling,
                  "none | linear | dynamic | llama3 | yarn | longrope (default: the architecture's)")
      ->check(CLI::IsMember({"none", "linear", "dynamic", "llama3", "yarn", "longrope"}));
  app->add_option("--rope-scaling-factor", options->rope_scaling_factor,
                  "default 8 for llama3, 4 otherwise; the original context is "
                  "max-position-embeddings / factor");
  app->add_option(
         "--dtype", *type_name,
         "f32 | f16 | bf16, or any GGUF type (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k..q6_k, iq4_nl, iq4_xs, mxfp4): "
         "every matrix of the GGUF in that type (rows that do not fit its blocks in f16), the HF copy in f16")
      ->check([](const std::string& name) -> std::string {
        const auto type = dtype_from_name(name);
        return type && *type != dtype::fp8_e4m3 && *type != dtype::fp8_e4m3_b128
                   ? ""
                   : "unknown or non-GGUF dtype '" + name + "'";
      })
      ->capture_default_str();
  app->add_option("--tokenizer", options->tokenizer, "HF directory, tokenizer.json or .gguf")->required();
  app->add_option("--seed", options->seed)->capture_default_str();
  app->add_option("--init-std", options->init_stddev, "standard deviation of the random matrices")
      ->capture_default_str();
  app->add_option("--norm-jitter", options->norm_jitter, "norm weights are 1 +- this")->capture_default_str();
  app->add_option("--out", options->out, "output directory")->required();
  return command{app, [options, type_name, norm_topk, attn_softcap, final_softcap] {
                   options->type = *dtype_from_name(*type_name);
                   if (!norm_topk->empty()) options->norm_topk_prob = *norm_topk == "true";
                   if (*attn_softcap >= 0) options->attn_logit_softcapping = *attn_softcap;
                   if (*final_softcap >= 0) options->final_logit_softcapping = *final_softcap;
                   made_model made = make_model(*options);
                   spdlog::info("wrote {} (HF) and {}: {}, {} layers, hidden {}, vocab {}{}", made.hf_dir.string(),
                                made.gguf_path.string(), made.config.architecture_name, made.config.num_layers,
                                made.config.hidden_size, made.config.vocab_size,
                                made.config.moe.num_experts > 0
                                    ? ", " + std::to_string(made.config.moe.num_experts) + " experts (top " +
                                          std::to_string(made.config.moe.experts_per_token) + ")"
                                    : std::string());
                   return 0;
                 }};
});

}  // namespace
}  // namespace troupe::cli
