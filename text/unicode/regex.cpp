#include "text/unicode/regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>
#include <stdexcept>
#include <vector>

namespace troupe {
namespace {

// Unicode White_Space, as a class body (what Oniguruma's \s matches; PCRE2's \s adds U+180E).
constexpr std::string_view white_space_body =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

void append_case_pair(std::string& out, char c) {
  out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  out.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
}

}  // namespace

std::string translate_oniguruma_pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() * 2);
  std::vector<bool> group_folds;  // per open group: does it fold case?
  bool in_class = false;
  auto folding = [&] {
    for (bool f : group_folds)
      if (f) return true;
    return false;
  };
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\') {
      if (i + 1 >= pattern.size())
        throw std::runtime_error("regex '" + std::string(pattern) + "' ends with a backslash");
      const char e = pattern[++i];
      if (e == 's') {
        if (in_class)
          out += white_space_body;
        else
          out += "[" + std::string(white_space_body) + "]";
      } else if (e == 'S') {
        if (in_class)
          throw std::runtime_error("regex '" + std::string(pattern) +
                                   "': \\S inside a character class is not supported");
        out += "[^" + std::string(white_space_body) + "]";
      } else if ((e == 'p' || e == 'P' || e == 'x') && i + 1 < pattern.size() && pattern[i + 1] == '{') {
        const std::size_t close = pattern.find('}', i);
        if (close == std::string_view::npos)
          throw std::runtime_error("regex '" + std::string(pattern) + "': unterminated \\" + e + "{");
        out.push_back('\\');
        out.append(pattern.substr(i, close - i + 1));
        i = close;
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      if (folding() && std::isalpha(static_cast<unsigned char>(c))) {
        // A range a-z folds to a-zA-Z; a single letter to both cases.
        if (i + 2 < pattern.size() && pattern[i + 1] == '-' &&
            std::isalpha(static_cast<unsigned char>(pattern[i + 2]))) {
          const char last = pattern[i + 2];
          out += std::string{static_cast<char>(std::tolower(c)), '-', static_cast<char>(std::tolower(last)),
                             static_cast<char>(std::toupper(c)), '-', static_cast<char>(std::toupper(last))};
          i += 2;
        } else {
          append_case_pair(out, c);
        }
        continue;
      }
      out.push_back(c);
      continue;
    }
    if (c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (c == '(') {
      if (pattern.substr(i, 4) == "(?i:") {
        group_folds.push_back(true);
        out += "(?:";
        i += 3;
      } else if (pattern.substr(i, 2) == "(?" && i + 2 < pattern.size() &&
                 std::isalpha(static_cast<unsigned char>(pattern[i + 2])) && pattern[i + 2] != 'P') {
        throw std::runtime_error("regex '" + std::string(pattern) + "': inline option group at " + std::to_string(i) +
                                 " is not supported");
      } else {
        group_folds.push_back(false);
        out.push_back(c);
      }
      continue;
    }
    if (c == ')') {
      if (!group_folds.empty()) group_folds.pop_back();
      out.push_back(c);
      continue;
    }
    if (folding() && std::isalpha(static_cast<unsigned char>(c))) {
      out.push_back('[');
      append_case_pair(out, c);
      out.push_back(']');
      continue;
    }
    out.push_back(c);
  }
  return out;
}

struct unicode_regex::compiled {
  pcre2_code* code = nullptr;
  ~compiled() { pcre2_code_free(code); }
};

namespace {

// Match data and a JIT stack per thread: allocating them per call would dominate short matches,
// and the default 32 KiB JIT stack is too small for long whitespace runs.
struct match_scratch {
  pcre2_match_data* data = pcre2_match_data_create(64, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  match_scratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~match_scratch() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

match_scratch& scratch() {
  thread_local match_scratch instance;
  return instance;
}

}  // namespace

unicode_regex::unicode_regex(std::string_view oniguruma_pattern) : source_(oniguruma_pattern) {
  const std::string translated = translate_oniguruma_pattern(oniguruma_pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  auto result = std::make_shared<compiled>();
  result->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                               PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (result->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw std::runtime_error("regex '" + source_ + "' (as PCRE2 '" + translated + "') does not compile at offset " +
                             std::to_string(error_offset) + ": " + reinterpret_cast<const char*>(message));
  }
  // JIT is an optimisation; the interpreter gives the same answers if it is unavailable.
  pcre2_jit_compile(result->code, PCRE2_JIT_COMPLETE);
  code_ = std::move(result);
}

bool unicode_regex::find(std::string_view text, std::size_t start, std::size_t& match_begin,
                         std::size_t& match_end) const {
  auto& s = scratch();
  // The caller validated the UTF-8 once; checking it again on every call would make scanning a
  // long text quadratic.
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                             PCRE2_NO_UTF_CHECK, s.data, s.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0 && rc != 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    throw std::runtime_error("regex '" + source_ + "' failed to match: " + reinterpret_cast<const char*>(message));
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(s.data);
  match_begin = ovector[0];
  match_end = ovector[1];
  return true;
}

}  // namespace troupe
