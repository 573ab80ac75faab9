#include "tests/text/text_corpus.hpp"

#include <random>
#include <utility>

#include "text/unicode/utf8.hpp"

namespace troupe::testing {
namespace {

const std::vector<std::string>& fixed_texts() {
  static const std::vector<std::string> texts = {
      "",
      " ",
      "Hello world",
      "Hello, world! How are you doing today?",
      "Once upon a time, there was a little girl named Lily.",
      "  leading and trailing spaces  ",
      "multiple     spaces\tand\ttabs\n\nand newlines\r\n",
      "\n\n\n",
      "\t\t  \n \t",
      "It's, I'm, we've, they're, she'll, he'd, IT'S, DON'T",
      "don't can't won't isn't",
      "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1,000,000 1e10",
      "2024-01-15T12:34:56Z",
      "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
      "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v[0]; }\n",
      "for (let i = 0; i < 10; ++i) {\n\tconsole.log(`i=${i}`);\n}",
      "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
      "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
      "https://example.com/path?query=1&other=two#fragment",
      "email@example.org, @mention #hashtag $100 50% a&b a|b ~tilde^caret",
      "日本語のテキストです。東京は大きな都市です。",
      "中文文本测试，你好世界！",
      "한국어 텍스트입니다. 안녕하세요!",
      "Привет, мир! Как дела?",
      "Ελληνικά γράμματα: αβγδε ΑΒΓΔΕ",
      "مرحبا بالعالم",
      "שלום עולם",
      "नमस्ते दुनिया",
      "สวัสดีชาวโลก",
      "café naïve résumé façade Ångström",
      "cafe\xcc\x81 nai\xcc\x88ve re\xcc\x81sume\xcc\x81",  // decomposed accents (NFC composes them)
      "\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8",               // conjoining jamo: NFC makes a syllable
      "\xe2\x84\xab \xe2\x84\xa6 \xe0\xa5\x98",             // Angstrom sign, Ohm sign, Devanagari qa
      "e\xcc\xa3\xcc\x87 q\xcc\x87\xcc\xa3",                // combining marks out of canonical order
      "😀 😃 😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷",
      "emoji🙂in🙃the😉middle",
      "Mixed: English, 日本語, русский, 한국어, emoji 🎉, and numbers 12345.",
      "Tab\tseparated\tvalues\n1\t2\t3\n",
      "Line one\nLine two\r\nLine three\rLine four",
      "   \n   \n",
      "a  b   c    d     e",
      "!!!???...,,,;;;:::",
      "(parentheses) [brackets] {braces} <angles>",
      "ALL CAPS TEXT AND lower case text",
      "The quick brown fox jumps over the lazy dog.",
      "supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
      "x = 1 + 2 * 3 / 4 - 5 ** 6 // 7 % 8",
      "   indented\n      more indented\n  less",
      "ﬁ ﬂ ﬀ ½ ² ³ ① Ⅻ",
      "\xc2\xa0non-breaking\xe2\x80\x83"
      "em space\xe3\x80\x80"
      "ideographic space",
      "zero\xe2\x80\x8bwidth\xe2\x80\x8cjoiner\xe2\x80\x8dtest",
      "ſ 'ſ it'ſ K Kelvin",
  };
  return texts;
}

const std::vector<std::string>& fragments() {
  static const std::vector<std::string> list = {
      "the",
      "The",
      "a",
      "of",
      "and",
      "to",
      "in",
      "is",
      "was",
      "Lily",
      "Tom",
      "happy",
      "dog",
      "cat",
      "said",
      "she",
      "he",
      "it",
      "they",
      "play",
      "park",
      "ball",
      "big",
      "red",
      "little",
      "day",
      "time",
      "one",
      "tree",
      "sun",
      "hello",
      "world",
      "token",
      "izer",
      "ization",
      "un",
      "believ",
      "able",
      "ing",
      "ed",
      "ly",
      "tion",
      "don't",
      "it's",
      "we're",
      "I'm",
      "you'll",
      "he'd",
      "'s",
      "'t",
      "'re",
      "'ve",
      "'m",
      "'ll",
      "'d",
      "0",
      "1",
      "42",
      "123",
      "2024",
      "3.14",
      "1000000",
      "007",
      "٣",
      "४",
      ".",
      ",",
      "!",
      "?",
      ":",
      ";",
      "-",
      "--",
      "...",
      "(",
      ")",
      "[",
      "]",
      "{",
      "}",
      "<",
      ">",
      "\"",
      "'",
      "`",
      "/",
      "\\",
      "|",
      "@",
      "#",
      "$",
      "%",
      "^",
      "&",
      "*",
      "+",
      "=",
      "_",
      "~",
      "def",
      "return",
      "if",
      "else",
      "for",
      "while",
      "int",
      "std::vector",
      "->",
      "=>",
      "==",
      "!=",
      "&&",
      "||",
      "日本",
      "東京",
      "中文",
      "你好",
      "世界",
      "한국",
      "안녕",
      "こんにちは",
      "カタカナ",
      "Привет",
      "мир",
      "αβγ",
      "café",
      "naïve",
      "Zoë",
      "São",
      "Ærø",
      "straße",
      "😀",
      "🎉",
      "👍",
      "👍🏽",
      "❤️",
      "🔥",
      "🚀",
      "👨‍💻",
      "e\xcc\x81",
      "a\xcc\x8a",
      "o\xcc\x88\xcc\x81",
      "\xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab",
  };
  return list;
}

const std::vector<std::string>& separators() {
  static const std::vector<std::string> list = {" ",  " ",        " ",           " ",   "",    "  ",   "   ",  "\t",
                                                "\n", "\n\n",     "\r\n",        " \n", "\n ", "    ", "\t\t", ", ",
                                                ". ", "\xc2\xa0", "\xe3\x80\x80"};
  return list;
}

// Code point ranges fully assigned (and of stable properties) since well before Unicode 14.
const std::vector<std::pair<char32_t, char32_t>>& safe_ranges() {
  static const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E},       {0x20, 0x7E},       {0x20, 0x7E},     {0xA1, 0x24F},    {0x300, 0x36F},   {0x391, 0x3A1},
      {0x3A3, 0x3C9},     {0x400, 0x4FF},     {0x5D0, 0x5EA},   {0x621, 0x64A},   {0x660, 0x669},   {0x905, 0x939},
      {0x93C, 0x94D},     {0x966, 0x96F},     {0xE01, 0xE30},   {0x1100, 0x1112}, {0x1161, 0x1175}, {0x11A8, 0x11C2},
      {0x2010, 0x2027},   {0x2030, 0x205E},   {0x2190, 0x21FF}, {0x2200, 0x22FF}, {0x2460, 0x24FF}, {0x3041, 0x3096},
      {0x30A1, 0x30FA},   {0x4E00, 0x9FA5},   {0x4E00, 0x9FA5}, {0xAC00, 0xD7A3}, {0xFF01, 0xFF5E}, {0x1F300, 0x1F5FF},
      {0x1F600, 0x1F64F}, {0x20000, 0x2A6D6}, {0x9, 0xD},       {0x2000, 0x200A}, {0x3000, 0x3000}, {0x85, 0x85},
      {0xA0, 0xA0},       {0x1680, 0x1680},   {0x2028, 0x2029}, {0x200B, 0x200D},
  };
  return ranges;
}

}  // namespace

std::vector<std::string> make_text_corpus(std::size_t count, std::uint32_t seed,
                                          const std::vector<std::string>& specials) {
  std::mt19937 rng(seed);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  std::vector<std::string> corpus = fixed_texts();
  for (const auto& special : specials) {
    corpus.push_back(special);
    corpus.push_back("Hello" + special + "world");
    corpus.push_back(special + "user\nWhat is 2+2?" + special + "\n");
    corpus.push_back("text with " + special + " inside and " + special + special + " twice");
    corpus.push_back(" " + special + " ");
  }
  while (corpus.size() < count) {
    std::string text;
    switch (pick(4)) {
      case 0:
      case 1: {  // words, code and symbols with varied separators
        const std::size_t n = 1 + pick(24);
        for (std::size_t i = 0; i < n; ++i) {
          if (i > 0) text += separators()[pick(separators().size())];
          text += fragments()[pick(fragments().size())];
          if (!specials.empty() && pick(12) == 0) text += specials[pick(specials.size())];
        }
        break;
      }
      case 2: {  // random Unicode
        const std::size_t n = 1 + pick(40);
        for (std::size_t i = 0; i < n; ++i) {
          const auto& [first, last] = safe_ranges()[pick(safe_ranges().size())];
          utf8::append(text, first + static_cast<char32_t>(pick(last - first + 1)));
        }
        break;
      }
      default: {  // a mix of both, with whitespace runs
        const std::size_t n = 1 + pick(16);
        for (std::size_t i = 0; i < n; ++i) {
          if (pick(3) == 0) text += std::string(1 + pick(6), " \t\n"[pick(3)]);
          if (pick(2) == 0) {
            text += fragments()[pick(fragments().size())];
          } else {
            const auto& [first, last] = safe_ranges()[pick(safe_ranges().size())];
            utf8::append(text, first + static_cast<char32_t>(pick(last - first + 1)));
          }
        }
        break;
      }
    }
    corpus.push_back(std::move(text));
  }
  return corpus;
}

std::vector<std::vector<std::uint8_t>> make_byte_corpus(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  static const std::vector<std::uint8_t> interesting = {0x00, 0x41, 0x7F, 0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0,
                                                        0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF, 0x9F, 0xA0, 0x8F, 0x90};
  std::vector<std::vector<std::uint8_t>> corpus;
  for (std::size_t i = 0; i < count; ++i) {
    std::vector<std::uint8_t> bytes;
    const std::size_t n = 1 + rng() % 12;
    for (std::size_t k = 0; k < n; ++k) {
      if (rng() % 3 == 0) {
        bytes.push_back(static_cast<std::uint8_t>(rng() % 256));
      } else if (rng() % 2 == 0) {
        bytes.push_back(interesting[rng() % interesting.size()]);
      } else {  // the start of a valid multi-byte sequence, possibly cut short
        std::string encoded;
        utf8::append(encoded, static_cast<char32_t>(0x80 + rng() % 0x10F000));
        const std::size_t keep = 1 + rng() % encoded.size();
        bytes.insert(bytes.end(), encoded.begin(), encoded.begin() + static_cast<std::ptrdiff_t>(keep));
      }
    }
    corpus.push_back(std::move(bytes));
  }
  return corpus;
}

}  // namespace troupe::testing
