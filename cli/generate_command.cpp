// troupe generate: one prompt through the engine (CPU or CUDA), the text streamed to stdout as it
// is generated, then a timing line on stderr. No actors: the plain llm_engine, step by step.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "backends/backend_selection.hpp"
#include "cli/command_registry.hpp"
#include "doors/speculative_usage.hpp"
#include "engine/llm_engine.hpp"
#include "engine/draft_model_proposer.hpp"
#include "engine/ngram_proposer.hpp"
#include "engine/process_memory.hpp"
#include "engine/served_model.hpp"
#include "text/chat_template.hpp"
#include "text/stop_string_matcher.hpp"
#include "text/tokenizer.hpp"

namespace troupe::cli {
namespace {

struct generate_flags {
  std::string model_path;
  std::string load_format = "auto";
  std::string prompt;
  std::string chat;
  std::string system;
  int max_tokens = 128;
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;
  std::vector<int32_t> stop_ids;
  int threads = 0;
  int logprobs = -1;
  int num_speculative_tokens = -1;
  std::string device = "cpu";
  float gpu_memory_utilization = 0.9f;
  std::string dtype = "bf16";
  std::string kv_cache_dtype = "auto";
  int nano_batches = 1;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  std::string draft_model;
  int ngram_min = ngram_settings{}.min_n;
  int ngram_max = ngram_settings{}.max_n;
};

std::vector<int32_t> prompt_ids(const generate_flags& flags, const tokenizer& tok) {
  if (flags.chat.empty()) return tok.encode(flags.prompt, true);
  if (tok.chat_template_source().empty()) {
    throw std::runtime_error("--chat: the model at " + flags.model_path + " has no chat_template");
  }
  nlohmann::json messages = nlohmann::json::array();
  if (!flags.system.empty()) messages.push_back({{"role", "system"}, {"content", flags.system}});
  messages.push_back({{"role", "user"}, {"content", flags.chat}});
  const std::string text =
      chat_template(tok.chat_template_source()).apply(messages, true, tok.bos_token(), tok.eos_token());
  // The template writes BOS itself where the model wants one.
  return tok.encode(text, false);
}

sampling_params to_params(const generate_flags& flags) {
  sampling_params p;
  p.temperature = flags.temperature;
  p.top_k = flags.top_k;
  p.top_p = flags.top_p;
  p.min_p = flags.min_p;
  p.repetition_penalty = flags.repetition_penalty;
  p.presence_penalty = flags.presence_penalty;
  p.frequency_penalty = flags.frequency_penalty;
  p.seed = flags.seed;
  p.max_tokens = flags.max_tokens;
  p.stop_token_ids = flags.stop_ids;
  p.ignore_eos = flags.ignore_eos;
  p.stop = flags.stop;
  p.logprobs = flags.logprobs;
  p.num_speculative_tokens = flags.num_speculative_tokens;
  // The same rules as both doors, so a flag gets the verdict a request field would.
  if (auto problem = validate_sampling_params(p, protocol_limits{})) {
    std::string flag = problem->field;
    std::replace(flag.begin(), flag.end(), '_', '-');
    throw std::runtime_error(problem->field + " " + problem->problem + " (--" + flag + ")");
  }
  normalize_sampling_params(p);
  return p;
}

void print_logprobs(const tokenizer& tok, const std::vector<int32_t>& ids, const std::vector<token_logprobs>& lps) {
  for (size_t i = 0; i < ids.size() && i < lps.size(); ++i) {
    std::string line = fmt::format(
        "logprob {:>6} {:<16} {:9.4f}", ids[i],
        nlohmann::json(tok.id_to_token(ids[i])).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
        lps[i].logprob);
    for (size_t k = 0; k < lps[i].top_token_ids.size(); ++k) {
      line += fmt::format("  {}:{:.4f}", lps[i].top_token_ids[k], lps[i].top_logprobs[k]);
    }
    std::cerr << line << "\n";
  }
}

// The drafts' source: the draft model, sized for this one sequence and its drafts, or n-gram
// prompt lookup. Checked before the target runs: a draft of another vocabulary is refused by name.
std::unique_ptr<draft_proposer> make_proposer(const generate_flags& flags, const model_spec& target, int vocab_size) {
  if (flags.ngram_min < 1 || flags.ngram_max < flags.ngram_min) {
    throw std::runtime_error(fmt::format("--ngram-min {} and --ngram-max {} must satisfy 1 <= min <= max",
                                         flags.ngram_min, flags.ngram_max));
  }
  if (flags.draft_model.empty())
    return std::make_unique<ngram_proposer>(ngram_settings{flags.ngram_min, flags.ngram_max});
  model_spec draft = target;
  draft.path = flags.draft_model;
  draft.format = load_format::auto_detect;
  draft.max_model_len = 0;
  draft.num_kv_blocks =
      (target.max_model_len + protocol_limits{}.max_speculative_tokens + draft.block_size - 1) / draft.block_size;
  try {
    return std::make_unique<draft_model_proposer>(load_draft_model(draft, vocab_size), vocab_size);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("--draft-model: ") + e.what());
  }
}

int run(const generate_flags& flags) {
  if (flags.prompt.empty() == flags.chat.empty()) {
    throw std::runtime_error("give exactly one of --prompt TEXT or --chat TEXT");
  }
  std::unique_ptr<tokenizer> loaded_tokenizer = load_model_tokenizer(flags.model_path);
  const tokenizer& tok = *loaded_tokenizer;
  std::vector<int32_t> ids = prompt_ids(flags, tok);
  std::optional<stop_string_matcher> checked_stop;  // refused before the model loads
  try {
    checked_stop.emplace(flags.stop);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("--stop: ") + e.what());
  }
  stop_string_matcher& matcher = *checked_stop;
  const int num_prompt_tokens = static_cast<int>(ids.size());

  model_spec spec;
  spec.path = flags.model_path;
  spec.format = parse_load_format(flags.load_format);
  spec.device = parse_device_request(flags.device);
  spec.backend.threads = flags.threads;
  spec.backend.gpu_memory_utilization = flags.gpu_memory_utilization;
  spec.backend.cuda_dtype = parse_activation_dtype(flags.dtype);
  spec.backend.nano_batches = flags.nano_batches;
  spec.backend.kv_cache_dtype = flags.kv_cache_dtype;
  // One sequence: a context of exactly prompt + max_tokens (capped by the model), and the blocks
  // it can fill.
  spec.max_num_seqs = 1;
  spec.max_model_len = num_prompt_tokens + flags.max_tokens;
  spec.num_kv_blocks = (spec.max_model_len + spec.block_size - 1) / spec.block_size;
  spec.validate();
  std::shared_ptr<served_model> served = load_served_model(spec, std::move(loaded_tokenizer));
  // stdout carries only the generated text: the fallback's reason goes to stderr.
  if (!served->device_note.empty()) {
    std::cerr << (spec.device == device_request::cuda ? "warning: " : "note: ") << served->device_note << "\n";
  }
  engine_config config = served->base_engine_config();
  config.max_num_seqs = 1;
  std::unique_ptr<draft_proposer> proposer = make_proposer(flags, spec, config.vocab_size);
  llm_engine engine(std::move(served->backend_model), config, served->eos_token_ids);
  engine.set_draft_proposer(std::move(proposer));
  add_request_result added = engine.add_request(ids, to_params(flags));
  if (!added.ok()) throw std::runtime_error(added.error->message);

  // Detokenize with the prompt as context so the first token's leading space survives.
  incremental_detokenizer detok(tok, true);
  for (int32_t id : ids) detok.push(id);
  std::vector<int32_t> generated;
  std::vector<token_logprobs> logprobs;
  std::optional<token_delta> last;
  while (engine.has_unfinished()) {
    for (token_delta& out : engine.step()) {
      size_t printable = out.token_ids.size();
      if (out.finish == finish_reason::stop && printable > 0) --printable;  // the stop token itself
      size_t kept = matcher.matched() ? 0 : out.token_ids.size();           // nothing after a match
      for (size_t i = 0; i < printable && !matcher.matched(); ++i) {
        auto step = matcher.push(detok.push(out.token_ids[i]));
        std::cout << step.text;
        if (step.matched) {
          kept = i + 1;                   // the token that completed the stop string is the last one counted
          engine.stop(added.request_id);  // false when this very step finished it anyway
        }
      }
      std::cout.flush();
      generated.insert(generated.end(), out.token_ids.begin(), out.token_ids.begin() + kept);
      logprobs.insert(logprobs.end(), out.logprobs.begin(), out.logprobs.begin() + std::min(kept, out.logprobs.size()));
      if (out.finished()) last = std::move(out);
    }
  }
  const process_memory memory = current_process_memory();
  spdlog::info("memory after the request: RSS {:.1f} MiB (peak {:.1f} MiB)", memory.resident_bytes / 1048576.0,
               memory.peak_bytes / 1048576.0);
  if (!matcher.matched()) {
    auto step = matcher.push(detok.finish());
    std::cout << step.text << matcher.finish();  // the held tail, when no stop string completed
  }
  if (matcher.matched() && last) {
    last->finish = finish_reason::stop;
    if (last->metrics) last->metrics->num_output_tokens = static_cast<int>(generated.size());
  }
  if (isatty(STDOUT_FILENO)) std::cout << "\n";
  std::cout.flush();

  if (flags.logprobs >= 0) print_logprobs(tok, generated, logprobs);
  if (last && last->metrics) {
    const request_metrics& mt = *last->metrics;
    const double decode_time = mt.e2e - mt.ttft;
    const double prompt_rate = mt.ttft > 0 ? mt.num_prompt_tokens / mt.ttft : 0.0;
    const double gen_rate =
        mt.num_output_tokens > 1 && decode_time > 0 ? (mt.num_output_tokens - 1) / decode_time : 0.0;
    std::cerr << fmt::format(
        "prompt tokens: {}, prompt tokens/s: {:.1f}, generated tokens: {}, generated tokens/s: {:.1f}, "
        "finish: {}, TTFT: {:.1f} ms, TPOT: {:.2f} ms, backend: {}\n",
        mt.num_prompt_tokens, prompt_rate, mt.num_output_tokens, gen_rate, finish_reason_name(last->finish),
        mt.ttft * 1e3, mt.tpot * 1e3, engine.get_model().backend_name());
    // The figures the doors put in usage.speculative, computed the same way.
    if (auto s = speculative_usage_of(mt)) {
      std::cerr << fmt::format("speculative: {} draft tokens, {} accepted ({:.1f} %), {:.2f} tokens per step\n",
                               s->draft_tokens, s->accepted_tokens, 100.0 * s->acceptance_rate, s->tokens_per_step);
    }
  }
  return 0;
}

const bool registered = register_command([](CLI::App& parent) {
  auto f = std::make_shared<generate_flags>();
  auto* app = parent.add_subcommand("generate", "generate text from a prompt (CPU or CUDA), streamed to stdout");
  app->add_option("--model", f->model_path, "HF model directory, .gguf file (or config.json for dummy weights)")
      ->required();
  app->add_option("--load-format", f->load_format, "auto | safetensors | gguf | dummy")->capture_default_str();
  auto* prompt = app->add_option("--prompt", f->prompt, "the prompt text (BOS added as the tokenizer says)");
  auto* chat = app->add_option("--chat", f->chat, "a user message, rendered with the model's chat template");
  prompt->excludes(chat);
  app->add_option("--system", f->system, "a system message for --chat")->needs(chat);
  app->add_option("--max-tokens", f->max_tokens, "tokens to generate at most")->capture_default_str();
  app->add_option("--temperature", f->temperature, "0: greedy")->capture_default_str();
  app->add_option("--top-k", f->top_k, "0: off")->capture_default_str();
  app->add_option("--top-p", f->top_p, "1: off")->capture_default_str();
  app->add_option("--min-p", f->min_p, "0: off")->capture_default_str();
  app->add_option("--repetition-penalty", f->repetition_penalty, "1: off")->capture_default_str();
  app->add_option("--presence-penalty", f->presence_penalty, "0: off")->capture_default_str();
  app->add_option("--frequency-penalty", f->frequency_penalty, "0: off")->capture_default_str();
  app->add_option("--seed", f->seed, "makes sampling reproducible");
  app->add_option("--stop-id", f->stop_ids, "token id that ends generation (repeatable)");
  app->add_option("--stop", f->stop, "text that ends generation, not printed (repeatable)");
  app->add_option("--threads", f->threads, "CPU threads (0: one per hardware thread)")->capture_default_str();
  app->add_option("--device", f->device, "cpu | cuda | auto (cuda when a GPU answers; else the CPU, with a warning)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  app->add_option("--gpu-memory-utilization", f->gpu_memory_utilization, "CUDA: share of the GPU's memory to use")
      ->capture_default_str();
  app->add_option("--dtype", f->dtype, "CUDA activations and KV pool: f32 | f16 | bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  app->add_option("--kv-cache-dtype", f->kv_cache_dtype,
                  "KV cache element type: auto (CPU: f16 for quantized weights, else f32; CUDA: --dtype) | f32 | f16 | "
                  "bf16 | q8_0 | fp8_e4m3")
      ->check(CLI::IsMember({"auto", "f32", "f16", "bf16", "q8_0", "fp8_e4m3"}))
      ->capture_default_str();
  app->add_option("--nano-batches", f->nano_batches, "CUDA: spread the prompt's steps over this many streams (1 to 4)")
      ->check(CLI::Range(1, 4))
      ->capture_default_str();
  app->add_option("--logprobs", f->logprobs, "print each token's logprob and the top N on stderr");
  app->add_option("--num-speculative-tokens", f->num_speculative_tokens,
                  "speculative decoding: draft tokens verified per step, up to 16 (0: off; -1: the engine's default)")
      ->capture_default_str();
  app->add_flag("--ignore-eos", f->ignore_eos, "keep generating past EOS");
  app->add_option("--draft-model", f->draft_model,
                  "a smaller model of the same vocabulary that proposes the drafts (default: n-gram prompt lookup)");
  app->add_option("--ngram-min", f->ngram_min, "n-gram prompt lookup: the shortest suffix matched")
      ->capture_default_str();
  app->add_option("--ngram-max", f->ngram_max, "n-gram prompt lookup: the longest suffix, tried first")
      ->capture_default_str();
  return command{app, [f] { return run(*f); }};
});

}  // namespace
}  // namespace troupe::cli
