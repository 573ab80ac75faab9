#include "grammar/guided_grammar.hpp"

#include <list>
#include <mutex>
#include <unordered_map>

#include "grammar/grammar_error.hpp"
#include "grammar/json_schema_regex.hpp"

namespace troupe {

namespace {

// Distinct schemas a process keeps compiled; beyond it the least recently used goes.
constexpr size_t max_cached_grammars = 256;

class grammar_cache {
 public:
  std::shared_ptr<const compiled_grammar> find(const std::string& key) {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second.position);
    return it->second.grammar;
  }
  void put(std::shared_ptr<const compiled_grammar> grammar) {
    std::lock_guard lock(mutex_);
    if (entries_.count(grammar->key)) return;
    order_.push_front(grammar->key);
    entries_.emplace(grammar->key, entry{grammar, order_.begin()});
    if (entries_.size() > max_cached_grammars) {
      entries_.erase(order_.back());
      order_.pop_back();
    }
  }

 private:
  struct entry {
    std::shared_ptr<const compiled_grammar> grammar;
    std::list<std::string>::iterator position;
  };
  std::mutex mutex_;
  std::list<std::string> order_;  // most recently used first
  std::unordered_map<std::string, entry> entries_;
};

grammar_cache& cache() {
  static grammar_cache instance;
  return instance;
}

const char* field_of(guided_kind kind) {
  switch (kind) {
    case guided_kind::regex: return "guided_regex";
    case guided_kind::choice: return "guided_choice";
    default: return "guided_json";
  }
}

}  // namespace

std::string guided_cache_key(const guided_decoding& g) {
  std::string key(1, static_cast<char>('0' + static_cast<int>(g.kind)));
  key += g.source;
  for (const std::string& choice : g.choices) {
    key += '\0';
    key += choice;
  }
  return key;
}

std::string guided_regex(const guided_decoding& g) {
  switch (g.kind) {
    case guided_kind::none: throw grammar_error("no constraint given");
    case guided_kind::json_object: return json_object_regex();
    case guided_kind::regex: return g.source;
    case guided_kind::choice: {
      std::string out;
      for (size_t i = 0; i < g.choices.size(); ++i) {
        if (i > 0) out += '|';
        out += regex_escape(g.choices[i]);
      }
      return out;
    }
    case guided_kind::json_schema: {
      nlohmann::ordered_json schema;
      try {
        schema = nlohmann::ordered_json::parse(g.source);
      } catch (const nlohmann::json::exception& e) {
        throw grammar_error(std::string("the schema is not valid JSON: ") + e.what());
      }
      return json_schema_to_regex(schema);
    }
  }
  throw grammar_error("unknown constraint kind");
}

std::shared_ptr<const compiled_grammar> compile_guided(const guided_decoding& g) {
  std::string key = guided_cache_key(g);
  if (auto found = cache().find(key)) return found;
  std::string regex = guided_regex(g);
  auto grammar = std::make_shared<compiled_grammar>(compiled_grammar{std::move(key), regex, byte_dfa::compile(regex)});
  cache().put(grammar);
  return grammar;
}

std::optional<sampling_problem> check_guided_decoding(const sampling_params& params) {
  if (!is_guided(params)) return std::nullopt;
  std::shared_ptr<const compiled_grammar> grammar;
  try {
    grammar = compile_guided(params.guided);
  } catch (const grammar_error& e) {
    return sampling_problem{field_of(params.guided.kind), std::string("cannot be compiled: ") + e.what()};
  }
  const int32_t shortest = grammar->dfa.distance(grammar->dfa.start());
  if (params.max_tokens < shortest + 1) {
    return sampling_problem{
        "max_tokens", std::to_string(params.max_tokens) + " leaves no room for the constraint's shortest output of " +
                          std::to_string(shortest) + " bytes and its EOS (one token per byte at worst): at least " +
                          std::to_string(shortest + 1)};
  }
  return std::nullopt;
}

}  // namespace troupe
