#pragma once
// What a benchmark run sends: one prompt and one output length per request, drawn from random
// lengths (fixed or a distribution), a ShareGPT-format file, or shared-prefix groups. Drawn once,
// before the run, from --seed, so two runs with the same flags send the same requests.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "text/tokenizer.hpp"

namespace troupe::bench_tool {

// One request: exactly one of prompt_text and prompt_ids is what goes on the wire; the other
// may be empty. prompt_len is the intended number of prompt tokens (the server's count, when it
// reports one, is what the results use).
struct bench_request {
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  int prompt_len = 0;
  int output_len = 0;
};

enum class length_distribution { fixed, uniform, normal, lognormal };
length_distribution parse_length_distribution(const std::string& name);

// A length around `mean`: fixed; uniform in [mean(1 - spread), mean(1 + spread)]; normal with
// standard deviation mean * spread; lognormal with that mean and sigma = spread. Never below 1.
struct length_spec {
  int mean = 0;
  length_distribution distribution = length_distribution::fixed;
  double spread = 0.0;
};

enum class prompt_form { token_ids, text };

struct random_workload {
  length_spec input;
  length_spec output;
  int shared_prefix_len = 0;  // tokens every request of a group starts with
  int num_prefix_groups = 1;  // requests take their group round-robin
  int vocab_size = 256;       // random ids are drawn from [first_token_id, vocab_size)
  int first_token_id = 3;     // below: the control tokens (unk, BOS, EOS) of Llama-style vocabularies
};

// Random prompts: token ids (the ZeroMQ door takes them as they are), or text of about that many
// tokens: random ids decoded with `tokenizer` when one is given (as vLLM does), else random
// words from a small list of common English words (about one token each for GPT-style BPE; the
// server's own count of prompt tokens is what the results report).
std::vector<bench_request> make_random_requests(const random_workload& workload, int num_requests, prompt_form form,
                                                const troupe::tokenizer* tokenizer, uint64_t seed);

// A ShareGPT-format JSON file: an array of {conversations: [{from: "human", value}, {from: "gpt",
// value}, ...]}. Each entry whose first turn is human and second is gpt gives one request: the
// human turn is the prompt; the output length is `fixed_output_len` when set, else the gpt turn's
// token count (by `tokenizer`, else its whitespace-separated words * 4 / 3). Entries are taken in
// an order shuffled by `seed`; fewer than num_requests usable entries is an error naming the file.
std::vector<bench_request> load_sharegpt_requests(const std::string& path, int num_requests,
                                                  std::optional<int> fixed_output_len, prompt_form form,
                                                  const troupe::tokenizer* tokenizer, uint64_t seed);

}  // namespace troupe::bench_tool
