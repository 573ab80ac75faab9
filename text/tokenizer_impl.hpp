#pragma once
// The parts of a loaded tokenizer, shared (immutable) by tokenizer copies and detokenizers.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "text/added_vocabulary.hpp"
#include "text/bpe_model.hpp"
#include "text/normalizer.hpp"
#include "text/post_processor.hpp"
#include "text/pre_tokenizer.hpp"
#include "text/token_decoder.hpp"

namespace troupe::detail {

struct token_entry {
  const std::string* text = nullptr;  // nullptr: an id no token has
  bool added = false;
  bool special = false;  // skipped by skip_special_tokens
};

struct tokenizer_impl {
  explicit tokenizer_impl(const nlohmann::json& tokenizer_json, const nlohmann::json& tokenizer_config);

  void encode_section(std::string_view text, std::size_t section_index, std::vector<std::int32_t>& ids) const;
  std::optional<std::int32_t> lookup(std::string_view token) const;

  std::unique_ptr<normalizer> normalizer_;
  std::unique_ptr<pre_tokenizer> pre_tokenizer_;
  bpe_model model;
  added_vocabulary added;
  token_map added_by_content;
  post_processor post;
  token_decoder decoder;
  std::vector<token_entry> entries;  // by id

  std::string bos_token, eos_token, chat_template;
  std::optional<std::int32_t> bos_id;
  std::vector<std::int32_t> eos_ids;
};

}  // namespace troupe::detail
