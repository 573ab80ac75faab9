#pragma once
// The two JSON documents a Hugging Face tokenizer is built from, found wherever the model lives:
// an HF directory, a bare tokenizer.json, or a GGUF file whose `tokenizer.ggml.*` metadata is
// turned into the equivalent HF documents (so one tokenizer implementation serves both formats).

#include <filesystem>

#include <nlohmann/json.hpp>

namespace troupe {

struct tokenizer_sources {
  nlohmann::json tokenizer_json;    // HF tokenizers' tokenizer.json (model, normalizer, decoder...)
  nlohmann::json tokenizer_config;  // tokenizer_config.json: bos/eos tokens, add_bos_token, chat_template
};

// `path` is an HF model directory (tokenizer.json [+ tokenizer_config.json]), a tokenizer.json
// file (its sibling tokenizer_config.json is read when present), or a .gguf file.
// A missing tokenizer_config.json gives an empty JSON object. Throws std::runtime_error naming
// the path and what is missing or malformed.
tokenizer_sources load_tokenizer_sources(const std::filesystem::path& path);

// Synthesizes HF documents from an already-open GGUF file's metadata (model "llama" or "gpt2").
class gguf_file;
tokenizer_sources tokenizer_sources_from_gguf(const gguf_file& file);

}  // namespace troupe
