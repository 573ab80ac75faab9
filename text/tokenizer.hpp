#pragma once
// A Hugging Face tokenizer (tokenizer.json + tokenizer_config.json): byte-level BPE (GPT-2,
// Llama 3, Qwen) and SentencePiece-style BPE with byte fallback (Llama 2, Mistral), added and
// special tokens, BOS/EOS, and the chat template source. Encoding is const and thread-safe.
//
// The pipeline, as in the reference implementation: added tokens are cut out of the raw text ->
// each remaining section is normalized -> pre-tokenized into pieces -> each piece BPE-merged ->
// the post-processor adds BOS (and the like).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe {

namespace detail {
struct tokenizer_impl;
}

class tokenizer {
 public:
  // tokenizer_config may be null or empty: then there is no chat template, no extra special
  // tokens, and BOS/EOS come from the post-processor and the added tokens only.
  static tokenizer from_json(const nlohmann::json& tokenizer_json, const nlohmann::json& tokenizer_config);
  // A Hugging Face model directory: tokenizer.json (required) and tokenizer_config.json (optional).
  static tokenizer from_directory(const std::filesystem::path& dir);
  // A tokenizer.json; the tokenizer_config.json beside it is read when present.
  static tokenizer from_file(const std::filesystem::path& tokenizer_json_path);

  // add_special_tokens: BOS and the like, as the post-processor (or tokenizer_config's
  // add_bos_token / add_eos_token when the post-processor adds none) says. Special tokens written
  // in the text are always recognised. Invalid UTF-8 is read as U+FFFD.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Ids outside the vocabulary decode to nothing.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens = false) const;

  // One past the largest id (model vocabulary and added tokens).
  std::int32_t vocab_size() const;
  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(std::int32_t id) const;  // raw vocabulary string, "" when unknown
  // The bytes `id` adds to a generated text (token_decoder::token_bytes): what logprobs report
  // and what structured output matches. A special token is its content; "" for an unknown id.
  std::string token_bytes(std::int32_t id) const;
  bool is_special(std::int32_t id) const;
  std::optional<std::int32_t> bos_token_id() const;
  // tokenizer_config's eos_token; without one, the added special tokens that end text or turns
  // ("</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>").
  std::vector<std::int32_t> eos_token_ids() const;
  std::string bos_token() const;  // "" when none
  std::string eos_token() const;  // "" when none
  // tokenizer_config "chat_template" ("" if none; of a list of named templates, "default").
  const std::string& chat_template_source() const;

 private:
  friend class incremental_detokenizer;
  explicit tokenizer(std::shared_ptr<const detail::tokenizer_impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const detail::tokenizer_impl> impl_;
};

}  // namespace troupe

#include "text/incremental_detokenizer.hpp"  // part of this header's API
