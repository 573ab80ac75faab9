#pragma once
// The split regexes of the byte-level BPE tokenizers Troupe knows by name (as in their
// published tokenizer.json files); GGUF names them through tokenizer.ggml.pre.

namespace troupe {

// Llama 3 ("llama-bpe" in GGUF).
inline constexpr const char* llama3_split_pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Qwen2 / Qwen2.5 / Qwen3 ("qwen2" in GGUF): like Llama 3's but one digit at a time.
inline constexpr const char* qwen2_split_pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// OpenAI's o200k (GPT-4o, gpt-oss's o200k_harmony; "gpt-4o" in GGUF): words keep their case
// runs and contractions, digits in threes.
inline constexpr const char* o200k_split_pattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|"
    "'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|"
    "'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// GGUF token types (tokenizer.ggml.token_type).
enum class gguf_token_type : int { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

}  // namespace troupe
