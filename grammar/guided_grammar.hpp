#pragma once
// A request's constraint (sampling_params::guided) compiled once: its regular expression and
// byte-level automaton, cached process-wide by kind and source, so the door that checks a
// schema and the worker that applies it (and every request with the same schema) share it.

#include <memory>
#include <optional>
#include <string>

#include "grammar/byte_dfa.hpp"
#include "protocol/sampling_params.hpp"

namespace troupe {

struct compiled_grammar {
  std::string key;    // guided_cache_key of its source
  std::string regex;  // what the output must match as a whole
  byte_dfa dfa;
};

// The cache key: the kind and the source (choices joined with a separator no string holds).
std::string guided_cache_key(const guided_decoding& guided);

// The regular expression `guided` stands for. Throws grammar_error naming what is unsupported.
std::string guided_regex(const guided_decoding& guided);

// Compiles (or finds in the cache) the constraint. Throws grammar_error. Thread-safe.
std::shared_ptr<const compiled_grammar> compile_guided(const guided_decoding& guided);

// The doors' check of a guided request, after validate_sampling_params: the constraint must
// compile, and max_tokens must leave room for its shortest output and the EOS after it (counted
// in bytes, which is what the length rule needs: every byte is a token of the vocabulary, see
// grammar_matcher).
// The field is the ZeroMQ protocol's name (guided_json, guided_regex, guided_choice, max_tokens).
std::optional<sampling_problem> check_guided_decoding(const sampling_params& params);

}  // namespace troupe
