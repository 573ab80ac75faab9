#include "text/byte_level.hpp"

#include "text/unicode/utf8.hpp"

namespace troupe::byte_level {
namespace {

struct alphabet {
  std::array<char32_t, 256> byte_to_char{};
  std::array<std::string, 256> byte_to_utf8;
  std::array<int, 512> char_to_byte{};  // every mapped character is below U+0200

  alphabet() {
    // Printable Latin-1 bytes keep their own code point; the rest are moved to U+0100 upwards
    // in byte order.
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int shifted = 0;
    for (int b = 0; b < 256; ++b)
      byte_to_char[b] = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + shifted++);
    char_to_byte.fill(-1);
    for (int b = 0; b < 256; ++b) {
      utf8::append(byte_to_utf8[b], byte_to_char[b]);
      char_to_byte[byte_to_char[b]] = b;
    }
  }
};

const alphabet& the_alphabet() {
  static const alphabet instance;
  return instance;
}

}  // namespace

const std::array<std::string, 256>& byte_to_utf8() { return the_alphabet().byte_to_utf8; }

int char_to_byte(char32_t cp) { return cp < 512 ? the_alphabet().char_to_byte[cp] : -1; }

}  // namespace troupe::byte_level
