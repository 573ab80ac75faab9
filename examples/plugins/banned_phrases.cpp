// Banned phrases: a logits-hook plugin (ABI 1.1), in C++ over the header-only wrapper
// (troupe/plugin.hpp), that keeps configured phrases out of a request's output: before each
// token is sampled, it masks every token that would complete a phrase, given the tokens the
// request generated so far.
//
// A template to copy. What it shows:
//  - the logits hook: the request's row of logits, changed in place (-INFINITY masks a token);
//    the host checks the row afterwards (no NaN, something left to sample);
//  - reading the request's history (prompt, then outputs) that the host hands every call;
//  - state shared read-only by every call (the phrases), so no lock: the worker calls the hook
//    from one thread, but a plugin should not rely on that more than it must;
//  - configuration checked at start (a bad phrase stops the server, naming the library).
//
// Phrases are token-id sequences, the model's own tokens: the plugin sees ids, not text, and a
// host-side tokenization of text could split a phrase differently from how the model writes it.
// Get a phrase's ids from the server: POST /tokenize {"prompt": "red ball", "add_special_tokens":
// false, "return_token_strs": true} (no leading space: a SentencePiece tokenizer marks the word start
// itself, and a space would add a token of its own; token_strs shows what each id is). Configuration: {"phrases":
// [[1234, 567], [89]]}. A phrase of one token bans that token. What it bans is the token sequence: the model may still
// spell the same text with other tokens (a rarer split); list those sequences too where it matters.
//
// Only the generated tokens count: a phrase begun in the prompt and completed by the output is
// not banned (the client wrote its first half).
//
// A request opts in by name: {"plugins": ["banned_phrases"]} (OpenAI body or ZeroMQ request).
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <troupe/plugin.hpp>

namespace {

class banned_phrases {
 public:
  explicit banned_phrases(std::string_view config_json) {
    const auto config = nlohmann::json::parse(config_json);
    const auto phrases = config.value("phrases", nlohmann::json::array());
    if (!phrases.is_array() || phrases.empty()) {
      throw std::runtime_error("\"phrases\" must be a non-empty array of token-id arrays");
    }
    for (const auto& phrase : phrases) {
      if (!phrase.is_array() || phrase.empty())
        throw std::runtime_error("each phrase must be a non-empty array of token ids");
      std::vector<int32_t> ids;
      for (const auto& id : phrase) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
          throw std::runtime_error("phrase " + phrase.dump() + " holds " + id.dump() + ", which is not a token id");
        }
        ids.push_back(id.get<int32_t>());
      }
      phrases_.push_back(std::move(ids));
    }
  }

  troupe_plugin_status on_logits(const troupe_logits& row, troupe::plugin_reply_ref) const {
    const int32_t* output = row.token_ids + row.num_prompt_ids;
    const size_t num_output = row.num_token_ids - row.num_prompt_ids;
    for (const std::vector<int32_t>& phrase : phrases_) {
      const size_t prefix = phrase.size() - 1;  // what the output must end with
      if (prefix > num_output) continue;
      bool ends_with_prefix = true;
      for (size_t i = 0; i < prefix && ends_with_prefix; ++i) {
        ends_with_prefix = output[num_output - prefix + i] == phrase[i];
      }
      const int32_t last = phrase.back();
      // An id past this model's vocabulary cannot be sampled: nothing to mask.
      if (ends_with_prefix && static_cast<size_t>(last) < row.vocab_size) row.logits[last] = -INFINITY;
    }
    return TROUPE_PLUGIN_OK;
  }

 private:
  std::vector<std::vector<int32_t>> phrases_;
};

}  // namespace

TROUPE_PLUGIN_CLASS(banned_phrases, "banned_phrases")
