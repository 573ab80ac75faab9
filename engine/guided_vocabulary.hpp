#pragma once
// The tokenizer's vocabulary as structured output needs it: the bytes each token id adds to the
// text (grammar/token_vocabulary.hpp), built once per served model. SentencePiece-style
// vocabularies (Llama 2: "▁" for a space, "<0x0A>" byte tokens) and byte-level ones (GPT-2,
// Llama 3: "Ġ" and friends standing for bytes) are read as their decoders read them; special
// tokens add no bytes and are never allowed by a grammar (EOS ends an output where it may),
// unless the vocabulary is for requests whose text keeps special tokens (spell_special): then each
// is its content, so a grammar that writes "[TOOL_CALLS]" or "<|channel|>" lets the model use the
// special token it was trained to write there, and the text still matches the grammar.

#include <cstdint>
#include <memory>
#include <vector>

#include "grammar/token_vocabulary.hpp"
#include "text/tokenizer.hpp"

namespace troupe {

// model_vocab_size: the rows of the model's logits (may exceed the tokenizer's ids, padding).
// end_ids: the ids that end an output (the served model's EOS ids).
std::shared_ptr<const token_vocabulary> make_token_vocabulary(const tokenizer& tok, int32_t model_vocab_size,
                                                              std::vector<int32_t> end_ids, bool spell_special = false);

}  // namespace troupe
