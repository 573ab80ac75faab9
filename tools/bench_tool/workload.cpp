#include "tools/bench_tool/workload.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace troupe::bench_tool {

namespace {

// Common short English words: with GPT-style BPE each is one token after a space.
const char* const common_words[] = {
    "the",   "of",     "and",   "to",    "in",      "is",    "was",   "he",      "for",     "it",      "with",
    "as",    "his",    "on",    "be",    "at",      "by",    "had",   "are",     "but",     "from",    "or",
    "have",  "an",     "they",  "which", "one",     "you",   "were",  "her",     "all",     "she",     "there",
    "would", "their",  "we",    "him",   "been",    "has",   "when",  "who",     "will",    "more",    "no",
    "if",    "out",    "so",    "said",  "what",    "up",    "its",   "about",   "into",    "than",    "them",
    "can",   "only",   "other", "new",   "some",    "could", "time",  "these",   "two",     "may",     "then",
    "do",    "first",  "any",   "my",    "now",     "such",  "like",  "our",     "over",    "man",     "me",
    "even",  "most",   "made",  "after", "also",    "did",   "many",  "before",  "must",    "through", "back",
    "years", "where",  "much",  "your",  "way",     "well",  "down",  "should",  "because", "each",    "just",
    "those", "people", "how",   "too",   "little",  "state", "good",  "very",    "make",    "world",   "still",
    "own",   "see",    "men",   "work",  "long",    "get",   "here",  "between", "both",    "life",    "being",
    "under", "never",  "day",   "same",  "another", "know",  "while", "last"};
constexpr int num_common_words = sizeof(common_words) / sizeof(common_words[0]);

int draw_length(const length_spec& spec, std::mt19937_64& rng) {
  const double mean = spec.mean;
  double value = mean;
  switch (spec.distribution) {
    case length_distribution::fixed: break;
    case length_distribution::uniform: {
      std::uniform_real_distribution<double> d(mean * (1.0 - spec.spread), mean * (1.0 + spec.spread));
      value = d(rng);
      break;
    }
    case length_distribution::normal: {
      std::normal_distribution<double> d(mean, mean * spec.spread);
      value = d(rng);
      break;
    }
    case length_distribution::lognormal: {
      // E[X] = exp(mu + sigma^2 / 2) = mean.
      const double sigma = spec.spread;
      std::lognormal_distribution<double> d(std::log(mean) - sigma * sigma / 2.0, sigma);
      value = d(rng);
      break;
    }
  }
  return std::max(1, static_cast<int>(std::lround(value)));
}

std::vector<int32_t> random_ids(int n, const random_workload& w, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> d(w.first_token_id, w.vocab_size - 1);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = d(rng);
  return ids;
}

std::string random_words(int n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> d(0, num_common_words - 1);
  std::string text;
  for (int i = 0; i < n; ++i) {
    if (i) text += ' ';
    text += common_words[d(rng)];
  }
  return text;
}

int count_words(const std::string& text) {
  std::istringstream in(text);
  std::string word;
  int n = 0;
  while (in >> word) ++n;
  return n;
}

}  // namespace

length_distribution parse_length_distribution(const std::string& name) {
  if (name == "fixed") return length_distribution::fixed;
  if (name == "uniform") return length_distribution::uniform;
  if (name == "normal") return length_distribution::normal;
  if (name == "lognormal") return length_distribution::lognormal;
  throw std::invalid_argument("unknown length distribution '" + name +
                              "' (expected fixed, uniform, normal or lognormal)");
}

std::vector<bench_request> make_random_requests(const random_workload& w, int num_requests, prompt_form form,
                                                const troupe::tokenizer* tokenizer, uint64_t seed) {
  if (w.input.mean < 1 && w.shared_prefix_len < 1) throw std::invalid_argument("--input-len must be at least 1");
  if (w.output.mean < 1) throw std::invalid_argument("--output-len must be at least 1");
  if (w.num_prefix_groups < 1) throw std::invalid_argument("--num-prefix-groups must be at least 1");
  if (w.vocab_size <= w.first_token_id) {
    throw std::invalid_argument("--vocab-size " + std::to_string(w.vocab_size) + " leaves no token id at or above " +
                                std::to_string(w.first_token_id));
  }
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prefix_ids;
  std::vector<std::string> prefix_words;
  for (int g = 0; g < w.num_prefix_groups && w.shared_prefix_len > 0; ++g) {
    prefix_ids.push_back(random_ids(w.shared_prefix_len, w, rng));
    prefix_words.push_back(random_words(w.shared_prefix_len, rng));
  }
  std::vector<bench_request> requests(num_requests);
  for (int i = 0; i < num_requests; ++i) {
    bench_request& r = requests[i];
    const int own_len = w.input.mean > 0 ? draw_length(w.input, rng) : 0;
    r.output_len = draw_length(w.output, rng);
    r.prompt_len = own_len + w.shared_prefix_len;
    const int group = w.shared_prefix_len > 0 ? i % w.num_prefix_groups : -1;
    if (form == prompt_form::token_ids || tokenizer) {
      if (group >= 0) r.prompt_ids = prefix_ids[group];
      const auto own = random_ids(own_len, w, rng);
      r.prompt_ids.insert(r.prompt_ids.end(), own.begin(), own.end());
      if (form == prompt_form::text) {
        r.prompt_text = tokenizer->decode(r.prompt_ids, true);
        r.prompt_ids.clear();
      }
    } else {
      if (group >= 0) r.prompt_text = prefix_words[group] + (own_len > 0 ? " " : "");
      r.prompt_text += random_words(own_len, rng);
    }
  }
  return requests;
}

std::vector<bench_request> load_sharegpt_requests(const std::string& path, int num_requests,
                                                  std::optional<int> fixed_output_len, prompt_form form,
                                                  const troupe::tokenizer* tokenizer, uint64_t seed) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open the ShareGPT file '" + path + "'");
  nlohmann::json data;
  try {
    data = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("the ShareGPT file '" + path + "' is not JSON: " + e.what());
  }
  if (!data.is_array())
    throw std::runtime_error("the ShareGPT file '" + path + "' is not a JSON array of conversations");
  if (form == prompt_form::token_ids && !tokenizer) {
    throw std::invalid_argument(
        "ShareGPT prompts over the ZeroMQ door as token ids need --tokenizer; "
        "without one they are sent as text");
  }
  std::vector<size_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<bench_request> requests;
  for (size_t index : order) {
    if (static_cast<int>(requests.size()) == num_requests) break;
    const auto& entry = data[index];
    if (!entry.is_object() || !entry.contains("conversations") || !entry["conversations"].is_array()) continue;
    const auto& turns = entry["conversations"];
    if (turns.size() < 2 || !turns[0].is_object() || !turns[1].is_object()) continue;
    if (turns[0].value("from", "") != "human" || turns[1].value("from", "") != "gpt") continue;
    if (!turns[0].contains("value") || !turns[0]["value"].is_string() || !turns[1].contains("value") ||
        !turns[1]["value"].is_string()) {
      continue;
    }
    const std::string prompt = turns[0]["value"];
    const std::string answer = turns[1]["value"];
    if (prompt.empty()) continue;
    bench_request r;
    if (tokenizer) {
      auto ids = tokenizer->encode(prompt, true);
      r.prompt_len = static_cast<int>(ids.size());
      r.output_len = fixed_output_len ? *fixed_output_len : static_cast<int>(tokenizer->encode(answer, false).size());
      if (form == prompt_form::token_ids) r.prompt_ids = std::move(ids);
    } else {
      r.prompt_len = count_words(prompt) * 4 / 3;
      r.output_len = fixed_output_len ? *fixed_output_len : count_words(answer) * 4 / 3;
    }
    if (form == prompt_form::text) r.prompt_text = prompt;
    // vLLM's filter: answers too short to time are left out.
    if (r.output_len < 4 && !fixed_output_len) continue;
    requests.push_back(std::move(r));
  }
  if (static_cast<int>(requests.size()) < num_requests) {
    throw std::runtime_error("the ShareGPT file '" + path + "' has " + std::to_string(requests.size()) +
                             " usable conversations (a human turn then a gpt turn, an answer of 4 tokens or more); "
                             "--num-prompts asks for " +
                             std::to_string(num_requests));
  }
  return requests;
}

}  // namespace troupe::bench_tool
