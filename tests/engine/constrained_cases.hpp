#pragma once
// The constrained requests a structured-output test runs, each with the case the oracle judges
// its output by (tests/engine/structured_oracle.hpp): schemas of the corpus, regexes, choices,
// and "any JSON object". Shared by the CPU engine test and the CUDA one, which differ only in
// the corpus, the lengths and the sampling they ask for.

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/guided_grammar.hpp"
#include "protocol/sampling_params.hpp"
#include "tests/engine/schema_corpus.hpp"

namespace troupe::testing {

struct constrained_case {
  nlohmann::ordered_json oracle_case;  // kind and schema / pattern / choices; output filled later
  sampling_params params;
};

struct constrained_corpus {
  uint64_t schema_seed = 0;  // schema_corpus_builder's
  uint64_t slack_seed = 0;   // the max_tokens draws'
  int num_schemas = 0;
  int max_slack = 0;  // max_tokens up to this far past a case's shortest output (and its EOS)
  std::vector<std::string> patterns;
  std::vector<std::vector<std::string>> choices;
  bool any_json_object = false;
};

// Schemas get case indices 0.., regexes 1000.., choices 2000.., the JSON object 3000. Every
// fifth index has no slack at all (the length rule decides every token); max_tokens never passes
// max_len, and a case whose shortest output does not fit is left out. `sample(params, index)`
// sets the rest of the sampling.
template <class Sample>
std::vector<constrained_case> build_constrained_cases(const constrained_corpus& corpus, int max_len, Sample sample) {
  std::vector<constrained_case> cases;
  std::mt19937 rng(static_cast<std::mt19937::result_type>(corpus.slack_seed));
  auto finish = [&](constrained_case c, int index) {
    const int shortest = compile_guided(c.params.guided)->dfa.distance(0);
    const int slack = index % 5 == 0 ? 0 : std::uniform_int_distribution<int>(1, corpus.max_slack)(rng);
    c.params.max_tokens = std::min(shortest + 1 + slack, max_len);  // + 1: the EOS
    sample(c.params, index);
    if (shortest + 1 <= max_len) cases.push_back(std::move(c));
  };
  schema_corpus_builder schemas(corpus.schema_seed);
  for (int i = 0; i < corpus.num_schemas; ++i) {
    const nlohmann::ordered_json schema = schemas.next();
    constrained_case c;
    c.oracle_case = {{"kind", "schema"}, {"schema", schema}};
    c.params.guided = {guided_kind::json_schema, schema.dump(), {}};
    finish(std::move(c), i);
  }
  for (size_t i = 0; i < corpus.patterns.size(); ++i) {
    constrained_case c;
    c.oracle_case = {{"kind", "regex"}, {"pattern", corpus.patterns[i]}};
    c.params.guided = {guided_kind::regex, corpus.patterns[i], {}};
    finish(std::move(c), 1000 + static_cast<int>(i));
  }
  for (size_t i = 0; i < corpus.choices.size(); ++i) {
    constrained_case c;
    c.oracle_case = {{"kind", "choice"}, {"choices", corpus.choices[i]}};
    c.params.guided = {guided_kind::choice, "", corpus.choices[i]};
    finish(std::move(c), 2000 + static_cast<int>(i));
  }
  if (corpus.any_json_object) {
    constrained_case any;
    any.oracle_case = {{"kind", "schema"}, {"schema", {{"type", "object"}}}};
    any.params.guided = {guided_kind::json_object, "", {}};
    finish(std::move(any), 3000);
  }
  return cases;
}

}  // namespace troupe::testing
