// Speculative decoding with n-gram drafts (prompt lookup) against plain decoding, side by side in
// one run, and what verifying drafts costs on a bigger model.
//
// Part 1, the engine end to end (llm_engine on the CPU backend, stories260K, greedy): the same
// engine settings with num_speculative_tokens 0 (plain) and k = 2, 4, 8, on three workloads:
//   repeat:      "read this text, then write it again" prompts (a hand-written passage, then its
//                opening once more), the shape of edits and summaries;
//   self-repeat: the same prompts around passages the model wrote itself, which its greedy
//                decoding re-tells in part (stories260K is too small to copy a passage it did
//                not write, see self_repeat_workload), so more of the output re-uses the prompt;
//   stories:     ordinary story openings, where a draft is a guess from the model's own output.
// At batch 1 (the prompts one after another) and batch 16 (all at once). Per configuration:
// output tokens/s end to end and without the prefill forwards (decode), the decode speedup
// against plain, acceptance rate (accepted / drafted, request_metrics), drafts and tokens per
// sampling step, the time of a decode step and the forward's share of it (the model is wrapped
// to time its forwards). Every speculative output must equal the plain one, token
// for token; the bench stops with an error naming the request where one does not. On "repeat",
// an oracle proposer (plain decoding's own outputs replayed as drafts, always right) shows the
// ceiling: what verification costs the engine when the proposer is not the limit.
//
// Part 2, the cost of verification: stories260K is far smaller than any model one would serve
// (hidden 64), so the forward of a 12-layer, hidden-768 llama-shaped random-weight model (made
// with model_maker into a temp dir when missing; --big-model takes any model) is timed directly:
// a decode batch of B sequences, each computing 1 + d query tokens with logits for every one of
// them (d drafts to verify), d = 0, 2, 4, 8.
// From the two parts: the speedup an acceptance rate buys on that model (tokens per step over
// the relative step cost), for a grid of rates and for the rates part 1 measured.
//
//   troupe_bench_speculative [--model HF_DIR] [--big-model DIR] [--drafts 2,4,8] [--batches 1,16]
//                            [--tokens 128] [--reps 3] [--threads 1] [--big-threads 2]
//                            [--context 256] [--step-reps 7] [--parts engine,verify] [--show 0]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>

#include "backends/cpu/blas_core.hpp"
#include "backends/cpu/cpu_model.hpp"
#include "bench/bench_support.hpp"
#include "bench/timed_model.hpp"
#include "engine/draft_proposer.hpp"
#include "engine/llm_engine.hpp"
#include "engine/model_runner.hpp"
#include "engine/scheduler.hpp"
#include "engine/served_model.hpp"
#include "model/loader/model_loader.hpp"
#include "model/model_maker.hpp"
#include "text/tokenizer.hpp"

namespace troupe {
namespace {

using clock_type = std::chrono::steady_clock;

// Short stories in the model's own register (TinyStories), so the copy is of text it can read.
const std::vector<std::string> passages = {
    "Lily had a red kite. Every day she ran to the hill with her dog Max. The wind was strong and the kite flew "
    "up high. One day the string broke and the kite flew over the trees. Lily was sad, but Max ran after it and "
    "found it by the pond. Lily hugged Max and said thank you.",
    "Tom found a little bird in the garden. The bird could not fly because its wing was hurt. Tom put the bird "
    "in a box with soft grass. His mom gave him some water for the bird. After three days the bird was better. "
    "Tom opened the box and the bird flew up to the big tree.",
    "There was a big bear who lived in the woods. The bear loved honey more than anything. One morning he saw a "
    "tree full of bees. He climbed up slowly and took some honey. The bees were angry and chased him. The bear "
    "ran to the river and jumped in the water.",
    "Sue and Ben went to the beach with their dad. They built a big sand castle with a high tower. Ben found a "
    "shiny shell and put it on the top. Then a wave came and the castle fell down. Sue laughed and said they "
    "could build a new one. They played until the sun went down.",
    "Once there was a small car named Zip. Zip liked to go fast on the road. One day it rained and the road was "
    "wet. Zip went too fast and slid into the mud. A big truck came and pulled Zip out. Zip said sorry and "
    "promised to drive slowly in the rain.",
    "Anna had a doll with a blue dress. She took the doll everywhere she went. At the park she put the doll on "
    "the bench and went to play on the swing. When she came back the doll was gone. A kind boy had found it and "
    "gave it back to her. Anna smiled and shared her apple with him.",
    "The sun was hot and the flowers were thirsty. A little girl named Mia took her green can and filled it with "
    "water. She gave water to every flower in the garden. The next day the flowers were tall and bright. Mia "
    "was proud and showed them to her grandma.",
    "Jack wanted to bake a cake for his mom. He got eggs, milk and sugar from the kitchen. He mixed them in a "
    "big bowl and put the cake in the oven. Soon the house smelled sweet. When his mom came home she was very "
    "happy. They ate the cake together at the table.",
};

// Ordinary story prompts: nothing in the prompt to copy.
const std::vector<std::string> story_openings = {
    "Once upon a time, there was a little girl named Lily.",
    "One day, a boy named Tim went to the park.",
    "There was a big cat who liked to sleep in the sun.",
    "Sam had a new red ball.",
    "Once upon a time, in a small house, there lived an old man.",
    "The dog ran to the door and barked.",
    "Mia wanted to go to the zoo with her dad.",
    "It was a rainy day and Ben was bored.",
    "A little fish lived in a big blue sea.",
    "Lucy found a shiny key under her bed.",
    "Once upon a time, there was a happy frog.",
    "The sky was dark and the wind was loud.",
    "Max and his mom went to the store to buy milk.",
    "Once there was a tree that could talk.",
    "Anna liked to draw pictures of the sun.",
    "A small bird sat on the window and sang.",
};

struct workload {
  std::string name;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_tokens;  // [prompts]
};

// The first `num_words` words of `text`.
std::string opening_of(const std::string& text, int num_words) {
  size_t at = 0;
  for (int w = 0; w < num_words && at != std::string::npos; ++w) at = text.find(' ', at + 1);
  return at == std::string::npos ? text : text.substr(0, at);
}

// Each request asks for `tokens` outputs, or what the model's length leaves (never under 32).
void add_prompt(workload& w, std::vector<int32_t> prompt, int tokens, int max_model_len) {
  const int room = max_model_len - static_cast<int>(prompt.size()) - 1;
  if (room < 32) {
    throw std::runtime_error(w.name + " prompt " + std::to_string(w.prompts.size()) + " has " +
                             std::to_string(prompt.size()) + " tokens, too long for max_model_len " +
                             std::to_string(max_model_len));
  }
  w.max_tokens.push_back(std::min(tokens, room));
  w.prompts.push_back(std::move(prompt));
}

// "Read this, then write it again": the passage, then its first words once more, so that a
// model that copies re-tells it from the prompt. Two framings alternate.
std::string repeat_text(const std::string& passage, int framing) {
  return framing % 2 == 0
             ? "Read the story and write it again.\n\n" + passage + "\n\nThe story again:\n\n" + opening_of(passage, 6)
             : "Here is a story. " + passage + "\nTell the same story once more. " + opening_of(passage, 4);
}

// The hand-written passages in both framings: 16 different prompts.
workload repeat_workload(const tokenizer& tok, int tokens, int max_model_len) {
  workload w{"repeat", {}, {}};
  for (int framing = 0; framing < 2; ++framing) {
    for (const std::string& p : passages) add_prompt(w, tok.encode(repeat_text(p, framing)), tokens, max_model_len);
  }
  return w;
}

workload stories_workload(const tokenizer& tok, int tokens, int max_model_len) {
  workload w{"stories", {}, {}};
  for (const std::string& s : story_openings) add_prompt(w, tok.encode(s), tokens, max_model_len);
  return w;
}

using bench::timed_model;  // the backend model, its prefill and decode forwards timed apart

struct run_figures {
  double seconds = 0;
  double prefill_seconds = 0;  // forwards with a prompt chunk in them
  double decode_forward_seconds = 0;
  int num_prefill_steps = 0;
  int num_engine_steps = 0;
  long num_output_tokens = 0;
  long num_draft_tokens = 0;
  long num_accepted_tokens = 0;
  long num_sampling_steps = 0;
  std::vector<std::vector<int32_t>> outputs;  // [prompts]
};

// Runs the workload's prompts `batch` at a time (each group to completion), greedy, to exactly
// their max_tokens (ignore_eos: every configuration generates the same number of tokens).
template <class Engine>
run_figures run_workload(Engine& engine, const workload& w, int batch) {
  run_figures f;
  f.outputs.resize(w.prompts.size());
  std::map<int64_t, size_t> prompt_of;
  const auto start = clock_type::now();
  for (size_t first = 0; first < w.prompts.size(); first += static_cast<size_t>(batch)) {
    const size_t end = std::min(w.prompts.size(), first + static_cast<size_t>(batch));
    for (size_t i = first; i < end; ++i) {
      sampling_params p;
      p.temperature = 0.0f;
      p.max_tokens = w.max_tokens[i];
      p.ignore_eos = true;
      const add_request_result added = engine.add_request(w.prompts[i], p);
      if (!added.ok()) {
        throw std::runtime_error(w.name + " prompt " + std::to_string(i) + " refused: " + added.error->message);
      }
      prompt_of[added.request_id] = i;
    }
    // Bounded: far more steps than a group's prompts and outputs can take (every step computes
    // at least one token of each running request).
    const int max_steps = 4 * (512 + 4096);
    int steps = 0;
    for (; steps < max_steps && engine.has_unfinished(); ++steps) {
      for (const request_output& o : engine.step()) {
        std::vector<int32_t>& out = f.outputs[prompt_of.at(o.request_id)];
        out.insert(out.end(), o.token_ids.begin(), o.token_ids.end());
        if (o.finished() && o.metrics) {
          f.num_output_tokens += o.metrics->num_output_tokens;
          f.num_draft_tokens += o.metrics->num_draft_tokens;
          f.num_accepted_tokens += o.metrics->num_accepted_tokens;
          f.num_sampling_steps += o.metrics->num_sampling_steps;
        }
      }
    }
    if (engine.has_unfinished()) {
      throw std::runtime_error(w.name + ": requests still unfinished after " + std::to_string(steps) + " steps");
    }
    f.num_engine_steps += steps;
  }
  f.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  return f;
}

// stories260K (260K parameters) does not copy a passage from its context: on "repeat" it
// writes a story of its own, so prompt lookup finds little. To measure what the engine gains when
// the output does re-use the prompt (what a capable model does on such prompts), "self-repeat"
// uses passages the model wrote itself (each story opening and its plain greedy continuation of
// `passage_tokens`), framed as in "repeat": its greedy decoding re-tells these in long spans,
// though not whole (the context differs from the one it first wrote them in).
workload self_repeat_workload(llm_engine& plain, const tokenizer& tok, const workload& stories, int passage_tokens,
                              int tokens, int max_model_len) {
  workload openings = stories;
  for (int& m : openings.max_tokens) m = passage_tokens;
  const run_figures written = run_workload(plain, openings, static_cast<int>(openings.prompts.size()));
  workload w{"self-repeat", {}, {}};
  for (size_t i = 0; i < story_openings.size(); ++i) {
    const std::string passage = story_openings[i] + " " + tok.decode(written.outputs[i], true);
    add_prompt(w, tok.encode(repeat_text(passage, static_cast<int>(i))), tokens, max_model_len);
  }
  return w;
}

// Throws naming the first request whose output differs from plain decoding's.
void check_same_outputs(const run_figures& plain, const run_figures& spec, const std::string& what) {
  for (size_t i = 0; i < plain.outputs.size(); ++i) {
    const auto& a = plain.outputs[i];
    const auto& b = spec.outputs[i];
    if (a == b) continue;
    size_t at = 0;
    while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
    throw std::runtime_error("OUTPUT MISMATCH (" + what + ", prompt " + std::to_string(i) +
                             "): greedy outputs differ at token " + std::to_string(at) + ": plain " +
                             (at < a.size() ? std::to_string(a[at]) : "<end>") + ", speculative " +
                             (at < b.size() ? std::to_string(b[at]) : "<end>") + " (lengths " +
                             std::to_string(a.size()) + " / " + std::to_string(b.size()) + ")");
  }
}

struct engine_settings {
  int num_blocks = 0;
  int threads = 1;
};

engine_config make_config(const loaded_model& loaded, const engine_settings& s, int num_drafts) {
  engine_config config;
  config.block_size = 16;
  config.num_kv_blocks = s.num_blocks;
  config.max_num_batched_tokens = 2048;
  config.max_num_seqs = 64;
  config.max_model_len = loaded.config.max_position_embeddings;
  // Every repeat runs the same prompts: a prefix cache would skip their prefill from the second on.
  config.enable_prefix_caching = false;
  config.num_speculative_tokens = num_drafts;
  config.max_speculative_tokens = 16;
  return config;
}

// Drafts that are always right: plain decoding's own outputs for the request, from the position
// it has reached. What verification costs the engine when the proposer is not the limit (the
// ceiling of any proposer on this model and machine).
class oracle_proposer final : public draft_proposer {
 public:
  void expect(int64_t request_id, int num_prompt_tokens, const std::vector<int32_t>& outputs) {
    expected_[request_id] = {num_prompt_tokens, &outputs};
  }
  void propose(std::span<const draft_request> requests, std::vector<std::vector<int32_t>>& drafts) override {
    drafts.resize(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      drafts[i].clear();
      const auto it = expected_.find(requests[i].request_id);
      if (it == expected_.end()) continue;
      // The history ends with the last output: the next one is outputs[history - prompt].
      const std::vector<int32_t>& outputs = *it->second.outputs;
      for (size_t j = requests[i].history.size() - static_cast<size_t>(it->second.num_prompt_tokens);
           j < outputs.size() && static_cast<int>(drafts[i].size()) < requests[i].max_drafts; ++j) {
        drafts[i].push_back(outputs[j]);
      }
    }
  }
  const char* name() const override { return "oracle"; }
  void clear() { expected_.clear(); }

 private:
  struct expected {
    int num_prompt_tokens = 0;
    const std::vector<int32_t>* outputs = nullptr;
  };
  std::unordered_map<int64_t, expected> expected_;
};

// llm_engine's step (schedule -> run -> update) with the oracle as the runner's proposer, which
// llm_engine does not let one set.
class oracle_engine {
 public:
  oracle_engine(std::unique_ptr<model> m, const engine_config& config, std::vector<int32_t> eos_token_ids)
      : model_(std::move(m)), scheduler_(config, std::move(eos_token_ids)), runner_(*model_, /*sampler_seed=*/7) {
    auto proposer = std::make_unique<oracle_proposer>();
    proposer_ = proposer.get();
    runner_.set_draft_proposer(std::move(proposer));
  }
  // The outputs to replay, by prompt (plain decoding's run of the same workload and batch).
  void set_answers(const workload& w, const std::vector<std::vector<int32_t>>& outputs) {
    answers_.clear();
    proposer_->clear();  // its expectations point into answers_
    for (size_t i = 0; i < w.prompts.size(); ++i) answers_[w.prompts[i]] = outputs.at(i);
  }
  add_request_result add_request(std::vector<int32_t> prompt_ids, sampling_params params) {
    const auto answer = answers_.find(prompt_ids);
    if (answer == answers_.end()) {
      throw std::runtime_error("oracle: no plain output for a prompt of " + std::to_string(prompt_ids.size()) +
                               " tokens");
    }
    const int64_t id = next_request_id_++;
    proposer_->expect(id, static_cast<int>(prompt_ids.size()), answer->second);
    if (auto error = scheduler_.add_request(id, std::move(prompt_ids), std::move(params))) {
      return {-1, std::move(error)};
    }
    return {id, std::nullopt};
  }
  std::vector<request_output> step() {
    const step_plan plan = scheduler_.schedule();
    if (plan.empty()) return {};
    return scheduler_.update(plan, runner_.run(plan));
  }
  bool has_unfinished() const { return scheduler_.has_unfinished(); }

 private:
  std::unique_ptr<model> model_;
  scheduler scheduler_;
  model_runner runner_;
  oracle_proposer* proposer_ = nullptr;  // owned by runner_
  std::map<std::vector<int32_t>, std::vector<int32_t>> answers_;
  int64_t next_request_id_ = 0;
};

// One configuration under test; all share the engine settings but num_speculative_tokens.
struct configuration {
  std::string name;
  int num_drafts = 0;
  std::unique_ptr<llm_engine> engine;  // plain and n-gram
  std::unique_ptr<oracle_engine> oracle;
  timed_model* timer = nullptr;  // the engine's model

  run_figures run(const workload& w, int batch) {
    timer->reset();
    run_figures f = engine ? run_workload(*engine, w, batch) : run_workload(*oracle, w, batch);
    f.prefill_seconds = timer->prefill_seconds;
    f.decode_forward_seconds = timer->decode_seconds;
    f.num_prefill_steps = timer->num_prefill_forwards;
    return f;
  }
};

// What part 1 measured for one (workload, batch, configuration), for the projection onto part 2's model.
struct engine_row {
  std::string workload;
  std::string config;
  int batch = 0;
  int num_drafts = 0;
  double tokens_per_second = 0;         // end to end, prefill included
  double decode_tokens_per_second = 0;  // without the prefill forwards
  double speedup = 0;                   // of decode tokens/s against plain
  double acceptance = 0;
  double drafts_per_step = 0;
  double tokens_per_step = 0;
};

std::vector<engine_row> run_engine_part(const std::string& model_path, const std::vector<int>& drafts,
                                        const std::vector<int>& batches, int tokens, int reps, int threads, int show,
                                        int passage_tokens) {
  load_options options;
  options.path = model_path;
  options.show_progress = false;
  const loaded_model loaded = load_model(options);
  const tokenizer tok = tokenizer::from_directory(model_path);
  const int max_model_len = loaded.config.max_position_embeddings;
  int max_batch = static_cast<int>(story_openings.size());
  for (int b : batches) max_batch = std::max(max_batch, b);
  engine_settings settings;
  settings.threads = threads;
  settings.num_blocks = max_batch * ((max_model_len + 15) / 16 + 1) + 16;
  std::vector<configuration> engines;
  auto add_configuration = [&](const std::string& name, int k, bool oracle) {
    auto timed = std::make_unique<timed_model>(
        make_cpu_model(loaded.config, loaded.weights, kv_cache_shape{settings.num_blocks, 16}, settings.threads));
    configuration c{name, k, nullptr, nullptr, timed.get()};
    if (oracle) {
      c.oracle = std::make_unique<oracle_engine>(std::move(timed), make_config(loaded, settings, k),
                                                 loaded.config.eos_token_ids);
    } else {
      c.engine = std::make_unique<llm_engine>(std::move(timed), make_config(loaded, settings, k), std::nullopt, 7);
    }
    engines.push_back(std::move(c));
  };
  add_configuration("plain", 0, false);
  for (int k : drafts) add_configuration("ngram k=" + std::to_string(k), k, false);
  const size_t num_ngram = engines.size();
  for (int k : drafts) add_configuration("oracle k=" + std::to_string(k), k, true);
  const workload stories = stories_workload(tok, tokens, max_model_len);
  const std::vector<workload> workloads = {
      repeat_workload(tok, tokens, max_model_len),
      self_repeat_workload(*engines[0].engine, tok, stories, passage_tokens, tokens, max_model_len), stories};

  std::printf(
      "== part 1: the engine end to end: %s (hidden %d, %d layers, vocab %d), CPU backend, %d thread(s), greedy\n",
      model_path.c_str(), loaded.config.hidden_size, loaded.config.num_layers, loaded.config.vocab_size, threads);
  for (const workload& w : workloads) {
    int min_prompt = 1 << 30, max_prompt = 0;
    for (const auto& p : w.prompts) {
      min_prompt = std::min(min_prompt, static_cast<int>(p.size()));
      max_prompt = std::max(max_prompt, static_cast<int>(p.size()));
    }
    std::printf("   workload %-11s: %zu prompts of %d-%d tokens, %d output tokens each (ignore_eos)\n", w.name.c_str(),
                w.prompts.size(), min_prompt, max_prompt, *std::min_element(w.max_tokens.begin(), w.max_tokens.end()));
  }

  std::vector<engine_row> rows;
  for (const workload& w : workloads) {
    for (int batch : batches) {
      // The oracle's ceiling once, on the first workload: it accepts every draft whatever the text.
      const size_t num_configs = &w == &workloads.front() ? engines.size() : num_ngram;
      // Best of `reps` per configuration, configurations interleaved so load changes hit all.
      std::vector<run_figures> best(num_configs);
      double min_load = 1e9, max_load = 0;
      for (int rep = 0; rep < reps; ++rep) {
        for (size_t e = 0; e < num_configs; ++e) {
          const double load = bench::load_average();
          min_load = std::min(min_load, load);
          max_load = std::max(max_load, load);
          if (engines[e].oracle) engines[e].oracle->set_answers(w, best[0].outputs);
          run_figures f = engines[e].run(w, batch);
          const std::string what =
              w.name + ", batch " + std::to_string(batch) + ", " + engines[e].name + ", repeat " + std::to_string(rep);
          // Plain decoding is deterministic too: every run is held to the first plain run.
          if (rep > 0 || e > 0) check_same_outputs(best[0], f, what);
          if (best[e].seconds == 0 || f.seconds < best[e].seconds) best[e] = std::move(f);
        }
      }
      std::printf("\n%s, batch %d (best of %d, load average %.1f-%.1f)\n", w.name.c_str(), batch, reps, min_load,
                  max_load);
      std::printf("  %-11s %9s %9s %8s %10s %11s %11s %9s %8s %6s\n", "config", "tokens/s", "decode/s", "speedup",
                  "acceptance", "drafts/step", "tokens/step", "ms/step", "forward", "steps");
      // Decode: the run without its prefill forwards (the same work in every configuration, and
      // a quarter of a plain run on "repeat"); each request's first token comes from its prefill.
      const auto decode_rate = [&](const run_figures& f) {
        return (f.num_output_tokens - static_cast<double>(w.prompts.size())) / (f.seconds - f.prefill_seconds);
      };
      const double plain_rate = decode_rate(best[0]);
      for (size_t e = 0; e < num_configs; ++e) {
        const run_figures& f = best[e];
        engine_row r;
        r.workload = w.name;
        r.config = engines[e].name;
        r.batch = batch;
        r.num_drafts = engines[e].num_drafts;
        r.tokens_per_second = f.num_output_tokens / f.seconds;
        r.decode_tokens_per_second = decode_rate(f);
        r.speedup = r.decode_tokens_per_second / plain_rate;
        r.acceptance = f.num_draft_tokens > 0 ? static_cast<double>(f.num_accepted_tokens) / f.num_draft_tokens : 0.0;
        r.drafts_per_step = static_cast<double>(f.num_draft_tokens) / f.num_sampling_steps;
        r.tokens_per_step = static_cast<double>(f.num_output_tokens) / f.num_sampling_steps;
        const double decode_seconds = f.seconds - f.prefill_seconds;
        std::printf("  %-11s %9.0f %9.0f %7.2fx %9.1f%% %11.2f %11.2f %9.3f %7.0f%% %6d\n", r.config.c_str(),
                    r.tokens_per_second, r.decode_tokens_per_second, r.speedup, 100.0 * r.acceptance, r.drafts_per_step,
                    r.tokens_per_step, 1000.0 * decode_seconds / (f.num_engine_steps - f.num_prefill_steps),
                    100.0 * f.decode_forward_seconds / decode_seconds, f.num_engine_steps);
        rows.push_back(r);
      }
      std::printf("  every speculative output equals plain decoding's (%zu prompts, %d repeats): yes\n",
                  w.prompts.size(), reps);
      for (int i = 0; i < show && i < static_cast<int>(w.prompts.size()) && batch == batches.front(); ++i) {
        std::printf("  prompt %d: %s\n  output %d: %s\n", i, tok.decode(w.prompts[i], true).c_str(), i,
                    tok.decode(best[0].outputs[i], true).c_str());
      }
    }
  }
  return rows;
}

// ---- part 2: what verification costs on the 12-layer, hidden-768 model ----

std::filesystem::path ensure_big_model(std::filesystem::path dir, const std::string& tokenizer_dir) {
  if (std::filesystem::exists(dir / "config.json") && std::filesystem::exists(dir / "model.safetensors")) return dir;
  std::printf("making the 12-layer hidden-768 random-weight model in %s ...\n", dir.string().c_str());
  std::fflush(stdout);
  model_maker_options o;
  o.arch = "llama3";
  o.hidden_size = 768;
  o.num_layers = 12;
  o.num_heads = 12;
  o.num_kv_heads = 12;
  o.intermediate_size = 3072;
  o.type = dtype::f16;
  o.tokenizer = tokenizer_dir;
  // Made beside and renamed into place, so an interrupted run leaves no half-written model.
  const std::filesystem::path part = dir.string() + ".part";
  std::filesystem::remove_all(part);
  o.out = part;
  make_model(o);
  std::filesystem::rename(part, dir);
  return dir;
}

// (batch, query tokens per sequence) -> median ms of one forward.
using step_costs = std::map<std::pair<int, int>, double>;

step_costs run_verify_part(const std::filesystem::path& dir, const std::vector<int>& drafts,
                           const std::vector<int>& batches, int context, int step_reps, int threads) {
  const int block_size = 16;
  int max_batch = 1, max_query = 1;
  for (int b : batches) max_batch = std::max(max_batch, b);
  for (int k : drafts) max_query = std::max(max_query, 1 + k);
  if (max_query > block_size) {
    throw std::runtime_error("--drafts: at most " + std::to_string(block_size - 1) + " drafts here");
  }
  const int context_blocks = (context + block_size - 1) / block_size;
  model_spec spec;
  spec.path = dir.string();
  spec.device = device_request::cpu;
  spec.backend.threads = threads;
  spec.block_size = block_size;
  // The context's blocks are shared by every sequence (computed once); each sequence writes its
  // new tokens into a block of its own after them.
  spec.num_kv_blocks = context_blocks + 2 * max_batch + 2;
  spec.max_model_len = context_blocks * block_size + 2 * block_size;
  auto served = load_served_model(spec);
  model& m = *served->backend_model;
  const model_config& config = m.config();
  std::printf(
      "\n== part 2: verification cost: %s (hidden %d, %d layers, %d heads, intermediate %d, vocab %d), "
      "CPU backend, %d thread(s), context %d tokens per sequence\n",
      dir.string().c_str(), config.hidden_size, config.num_layers, config.num_heads, config.intermediate_size,
      config.vocab_size, threads, context_blocks * block_size);
  const int ctx = context_blocks * block_size;
  auto token_at = [&](int i) { return static_cast<int32_t>(3 + (i * 7919) % (config.vocab_size - 3)); };

  // The shared context: one real prefill, so attention reads real K/V.
  forward_batch prefill;
  for (int t = 0; t < ctx; ++t) {
    prefill.token_ids.push_back(token_at(t));
    prefill.positions.push_back(t);
    prefill.slot_mapping.push_back(t);
  }
  prefill.query_start = {0, ctx};
  prefill.context_lengths = {ctx};
  prefill.block_table_start = {0, context_blocks};
  for (int b = 0; b < context_blocks; ++b) prefill.block_tables.push_back(b);
  prefill.logits_rows = {ctx - 1};
  std::vector<float> logits(static_cast<size_t>(max_batch * max_query) * config.vocab_size);  // [rows, vocab]
  const auto prefill_start = clock_type::now();
  m.forward(prefill, logits.data());
  std::printf("   shared context prefill: %.0f ms\n",
              std::chrono::duration<double, std::milli>(clock_type::now() - prefill_start).count());

  std::vector<int> queries = {1};
  for (int k : drafts) queries.push_back(1 + k);
  step_costs costs;
  std::printf("  %6s %7s %8s %10s %12s %12s %8s\n", "batch", "drafts", "tokens", "ms/step", "ms min-max",
              "x plain step", "load");
  for (int batch : batches) {
    for (int q : queries) {
      // B sequences after the shared context, each with q new tokens (the last input, then q-1
      // drafts), every row's logits wanted: the shape of a verification step.
      forward_batch b;
      b.query_start.push_back(0);
      b.block_table_start.push_back(0);
      for (int s = 0; s < batch; ++s) {
        const int own_block = context_blocks + s;
        for (int j = 0; j < q; ++j) {
          b.logits_rows.push_back(static_cast<int32_t>(b.token_ids.size()));
          b.token_ids.push_back(token_at(ctx + s * 31 + j));
          b.positions.push_back(ctx + j);
          b.slot_mapping.push_back(static_cast<int64_t>(own_block) * block_size + j);
        }
        b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
        b.context_lengths.push_back(ctx + q);
        for (int blk = 0; blk < context_blocks; ++blk) b.block_tables.push_back(blk);
        b.block_tables.push_back(own_block);
        b.block_table_start.push_back(static_cast<int32_t>(b.block_tables.size()));
      }
      std::vector<double> ms;
      for (int rep = 0; rep <= step_reps; ++rep) {  // rep 0 warms up
        const auto start = clock_type::now();
        m.forward(b, logits.data());
        if (rep > 0) ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - start).count());
      }
      std::sort(ms.begin(), ms.end());
      const double median = ms[ms.size() / 2];
      costs[{batch, q}] = median;
      std::printf("  %6d %7d %8d %10.2f %5.1f-%-6.1f %12.2f %8.1f\n", batch, q - 1, batch * q, median, ms.front(),
                  ms.back(), median / costs.at({batch, 1}), bench::load_average());
    }
  }
  return costs;
}

// The step cost at `query` tokens per sequence (fractional: a mean), relative to a plain step,
// interpolated linearly between the measured points.
double relative_cost(const step_costs& costs, int batch, double query) {
  const double plain = costs.at({batch, 1});
  auto lo = costs.end();
  for (auto it = costs.begin(); it != costs.end(); ++it) {
    if (it->first.first != batch) continue;
    if (it->first.second <= query) lo = it;
    if (it->first.second >= query) {
      if (lo == costs.end() || lo->first.second == it->first.second) return it->second / plain;
      const double t = (query - lo->first.second) / (it->first.second - lo->first.second);
      return (lo->second + t * (it->second - lo->second)) / plain;
    }
  }
  return lo->second / plain;  // past the last measured point: its cost (an underestimate)
}

void print_projection(const std::vector<engine_row>& rows, const step_costs& costs, const std::vector<int>& drafts,
                      const std::vector<int>& batches) {
  std::printf("\n== what an acceptance rate buys on part 2's model\n");
  std::printf(
      "tokens per step = 1 + acceptance x drafts per step; speedup = tokens per step / (step cost with "
      "1 + drafts tokens per sequence / plain step cost). Break-even acceptance = (cost - 1) / drafts.\n");
  std::printf("  %6s %7s %11s %11s", "batch", "drafts", "step cost", "break-even");
  const std::vector<double> acceptances = {0.2, 0.4, 0.6, 0.8, 1.0};
  for (double a : acceptances) std::printf("   a=%.1f", a);
  std::printf("\n");
  for (int batch : batches) {
    for (int k : drafts) {
      const double c = relative_cost(costs, batch, 1.0 + k);
      std::printf("  %6d %7d %10.2fx %10.0f%%", batch, k, c, 100.0 * (c - 1.0) / k);
      for (double a : acceptances) std::printf(" %6.2fx", (1.0 + a * k) / c);
      std::printf("\n");
    }
  }
  if (rows.empty()) return;
  std::printf("\npart 1's measured drafts and tokens per step, priced with part 2's step costs:\n");
  std::printf("  %-11s %-11s %6s %10s %11s %11s %10s %12s\n", "workload", "config", "batch", "acceptance",
              "drafts/step", "tokens/step", "step cost", "speedup");
  for (const engine_row& r : rows) {
    if (r.num_drafts == 0 || !costs.count({r.batch, 1})) continue;
    // The batch's mean tokens per sequence; sequences without drafts in a step cost one token.
    const double c = relative_cost(costs, r.batch, 1.0 + r.drafts_per_step);
    std::printf("  %-11s %-11s %6d %9.1f%% %11.2f %11.2f %9.2fx %11.2fx\n", r.workload.c_str(), r.config.c_str(),
                r.batch, 100.0 * r.acceptance, r.drafts_per_step, r.tokens_per_step, c, r.tokens_per_step / c);
  }
}

}  // namespace
}  // namespace troupe

int main(int argc, char** argv) try {
  troupe::cpu::restart_with_blas_settings(argv);  // backends/cpu/blas_core.hpp
  using namespace troupe;
  CLI::App app{"speculative decoding (n-gram drafts) against plain decoding, and the cost of verification"};
  std::string model_path = TROUPE_SHARED_DIR "/models/stories260K/hf";
  std::string big_model = (std::filesystem::temp_directory_path() / "troupe-spec-bench-768").string();
  std::string drafts_text = "2,4,8";
  std::string batches_text = "1,16";
  std::string parts = "engine,verify";
  int tokens = 128, reps = 3, threads = 1, big_threads = 2, context = 256, step_reps = 7, show = 0,
      passage_tokens = 128;
  app.add_option("--model", model_path, "the trained model for part 1 (HF directory)")->capture_default_str();
  app.add_option("--big-model", big_model, "the 12-layer hidden-768 model for part 2 (made here when missing)")
      ->capture_default_str();
  app.add_option("--drafts", drafts_text, "draft lengths k to compare with plain decoding")->capture_default_str();
  app.add_option("--batches", batches_text, "concurrent requests")->capture_default_str();
  app.add_option("--tokens", tokens, "output tokens per request (part 1)")->capture_default_str();
  app.add_option("--reps", reps, "repeats of part 1 (best reported)")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads of part 1's model")->capture_default_str();
  app.add_option("--big-threads", big_threads, "CPU threads of part 2's model")->capture_default_str();
  app.add_option("--context", context, "tokens each sequence already holds in part 2")->capture_default_str();
  app.add_option("--step-reps", step_reps, "timed forwards per shape in part 2 (median reported)")
      ->capture_default_str();
  app.add_option("--passage", passage_tokens, "tokens of each self-repeat passage (the model's own story)")
      ->capture_default_str();
  app.add_option("--show", show, "print the first N prompts of each workload and their greedy outputs")
      ->capture_default_str();
  app.add_option("--parts", parts, "engine, verify or both")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const std::vector<int> drafts = bench::parse_list(drafts_text);
  const std::vector<int> batches = bench::parse_list(batches_text);
  for (int k : drafts) {
    if (k <= 0 || k > 15) throw std::runtime_error("--drafts: " + std::to_string(k) + " is not in [1, 15]");
  }
  for (int b : batches) {
    if (b <= 0 || b > 64) throw std::runtime_error("--batches: " + std::to_string(b) + " is not in [1, 64]");
  }
  if (reps <= 0 || step_reps <= 0 || tokens <= 0 || context <= 0) {
    throw std::runtime_error("--reps, --step-reps, --tokens and --context must be positive");
  }
  const bool engine_part = parts.find("engine") != std::string::npos;
  const bool verify_part = parts.find("verify") != std::string::npos;
  if (!engine_part && !verify_part) throw std::runtime_error("--parts '" + parts + "' names neither engine nor verify");
  std::printf("load average %.2f at start\n", bench::load_average());
  const auto start = std::chrono::steady_clock::now();
  std::vector<engine_row> rows;
  if (engine_part) rows = run_engine_part(model_path, drafts, batches, tokens, reps, threads, show, passage_tokens);
  if (verify_part) {
    const auto dir = ensure_big_model(big_model, model_path);
    const step_costs costs = run_verify_part(dir, drafts, batches, context, step_reps, big_threads);
    print_projection(rows, costs, drafts, batches);
  }
  std::printf("\ntotal %.1f s, load average %.2f at the end\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), bench::load_average());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "troupe_bench_speculative: %s\n", e.what());
  return 1;
}
