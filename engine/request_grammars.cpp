#include "engine/request_grammars.hpp"

#include <stdexcept>

#include "grammar/grammar_error.hpp"
#include "grammar/guided_grammar.hpp"

namespace troupe {

namespace {

// Masks a worker keeps at once; beyond it the cache starts over (requests in flight keep theirs).
constexpr size_t max_cached_masks = 64;

}  // namespace

std::unique_ptr<grammar_matcher> request_grammars::start(const guided_decoding& guided, int64_t request_id,
                                                         bool special_tokens_in_text) {
  if (!vocabulary_) {
    throw std::runtime_error("request " + std::to_string(request_id) +
                             " asks for structured output, but this worker has no tokenizer vocabulary");
  }
  const bool spelled = special_tokens_in_text && with_special_;
  const std::string key = guided_cache_key(guided) + (spelled ? "\x1fspecial" : "");
  auto it = masks_.find(key);
  if (it == masks_.end()) {
    std::shared_ptr<const compiled_grammar> grammar;
    try {
      grammar = compile_guided(guided);
    } catch (const grammar_error& e) {
      throw std::runtime_error("request " + std::to_string(request_id) +
                               ": its constraint cannot be compiled: " + e.what());
    }
    if (masks_.size() >= max_cached_masks) masks_.clear();
    it = masks_.emplace(key, std::make_shared<token_masks>(std::move(grammar), spelled ? with_special_ : vocabulary_))
             .first;
  }
  return std::make_unique<grammar_matcher>(it->second);
}

}  // namespace troupe
