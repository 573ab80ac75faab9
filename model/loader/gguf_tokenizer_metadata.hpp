#pragma once
// The inverse of tokenizer_sources_from_gguf: writes an HF tokenizer as llama.cpp's
// tokenizer.ggml.* metadata, so a GGUF made by the model maker carries its own tokenizer.

#include "model/loader/gguf_writer.hpp"
#include "model/loader/tokenizer_sources.hpp"

namespace troupe {

// One past the largest token id (vocabulary and added tokens): the model's vocab_size.
int tokenizer_vocab_size(const tokenizer_sources& sources);

// A BPE tokenizer with byte fallback becomes model "llama" (scores ranked like the merges);
// a byte-level BPE becomes "gpt2" with merges and tokenizer.ggml.pre chosen from its split
// regex (llama-bpe, qwen2, or gpt-2). Adds bos/eos/unk/pad ids, add_bos/add_eos and the chat
// template. Throws for other tokenizer models (Unigram, WordPiece).
void add_tokenizer_metadata(gguf_writer& writer, const tokenizer_sources& sources);

}  // namespace troupe
