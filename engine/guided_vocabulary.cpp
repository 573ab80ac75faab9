#include "engine/guided_vocabulary.hpp"

#include <algorithm>
#include <string>

#include "text/byte_level.hpp"

namespace troupe {

namespace {

// "<0x0A>" -> 10, anything else -> -1.
int byte_fallback_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  try {
    return std::stoi(token.substr(3, 2), nullptr, 16);
  } catch (...) {
    return -1;
  }
}

// Decodes one UTF-8 character at `pos`; -1 on malformed input.
int32_t next_codepoint(const std::string& s, size_t& pos) {
  const auto lead = static_cast<unsigned char>(s[pos]);
  const int n = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
  if (n == 0 || pos + n > s.size()) return -1;
  int32_t cp = n == 1 ? lead : lead & (0x3F >> (n - 1));
  for (int i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  pos += n;
  return cp;
}

}  // namespace

std::shared_ptr<const token_vocabulary> make_token_vocabulary(const tokenizer& tok, int32_t model_vocab_size,
                                                              std::vector<int32_t> end_ids, bool spell_special) {
  const int32_t tokenizer_size = tok.vocab_size();
  // Byte fallback tokens mark a SentencePiece-style vocabulary; without them it is byte-level.
  const bool sentencepiece = tok.token_to_id("<0x0A>").has_value();
  std::vector<std::string> bytes(static_cast<size_t>(std::max(model_vocab_size, tokenizer_size)));
  for (int32_t id = 0; id < tokenizer_size; ++id) {
    if (tok.is_special(id)) {
      if (spell_special) bytes[static_cast<size_t>(id)] = tok.token_bytes(id);
      continue;
    }
    const std::string token = tok.id_to_token(id);
    std::string out;
    if (sentencepiece) {
      const int value = byte_fallback_value(token);
      if (value >= 0) {
        out.push_back(static_cast<char>(value));
      } else {
        for (size_t pos = 0; pos < token.size();) {
          if (token.compare(pos, 3, "\xE2\x96\x81") == 0) {  // "▁"
            out += ' ';
            pos += 3;
          } else {
            out += token[pos++];
          }
        }
      }
    } else {
      for (size_t pos = 0; pos < token.size();) {
        const int32_t cp = next_codepoint(token, pos);
        const int byte = cp < 0 ? -1 : byte_level::char_to_byte(static_cast<char32_t>(cp));
        if (byte < 0) {
          out.clear();  // not a byte-level string: an added token, never generated as text
          break;
        }
        out.push_back(static_cast<char>(byte));
      }
    }
    bytes[static_cast<size_t>(id)] = std::move(out);
  }
  end_ids.erase(std::remove_if(end_ids.begin(), end_ids.end(),
                               [&](int32_t id) { return id < 0 || id >= static_cast<int32_t>(bytes.size()); }),
                end_ids.end());
  return std::make_shared<token_vocabulary>(std::move(bytes), std::move(end_ids));
}

}  // namespace troupe
