#include "text/unicode/nfc.hpp"

#include <algorithm>
#include <vector>

#include "text/unicode/nfc_tables.hpp"
#include "text/unicode/utf8.hpp"

namespace troupe {
namespace {

namespace tables = unicode_tables;

// Hangul syllables are composed arithmetically (Unicode chapter 3.12).
constexpr char32_t hangul_s_base = 0xAC00, hangul_l_base = 0x1100, hangul_v_base = 0x1161, hangul_t_base = 0x11A7;
constexpr int hangul_l_count = 19, hangul_v_count = 21, hangul_t_count = 28;
constexpr int hangul_n_count = hangul_v_count * hangul_t_count;
constexpr int hangul_s_count = hangul_l_count * hangul_n_count;

int combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* begin = tables::combining_class_ranges;
  const auto* end = begin + tables::num_combining_class_ranges;
  const auto* it =
      std::upper_bound(begin, end, cp, [](char32_t c, const tables::combining_class_range& r) { return c < r.first; });
  if (it == begin) return 0;
  --it;
  return cp <= it->last ? it->combining_class : 0;
}

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= hangul_s_base && cp < hangul_s_base + hangul_s_count) {
    const int s_index = static_cast<int>(cp - hangul_s_base);
    out.push_back(hangul_l_base + s_index / hangul_n_count);
    out.push_back(hangul_v_base + (s_index % hangul_n_count) / hangul_t_count);
    if (s_index % hangul_t_count != 0) out.push_back(hangul_t_base + s_index % hangul_t_count);
    return;
  }
  if (cp >= 0xC0) {
    const auto* begin = tables::decompositions;
    const auto* end = begin + tables::num_decompositions;
    const auto* it = std::lower_bound(
        begin, end, cp, [](const tables::decomposition_entry& e, char32_t c) { return e.code_point < c; });
    if (it != end && it->code_point == cp) {
      out.insert(out.end(), tables::decomposition_code_points + it->offset,
                 tables::decomposition_code_points + it->offset + it->length);
      return;
    }
  }
  out.push_back(cp);
}

// The primary composite of (first, second), or 0 if there is none.
char32_t compose_pair(char32_t first, char32_t second) {
  if (first >= hangul_l_base && first < hangul_l_base + hangul_l_count && second >= hangul_v_base &&
      second < hangul_v_base + hangul_v_count) {
    return hangul_s_base + ((first - hangul_l_base) * hangul_v_count + (second - hangul_v_base)) * hangul_t_count;
  }
  if (first >= hangul_s_base && first < hangul_s_base + hangul_s_count &&
      (first - hangul_s_base) % hangul_t_count == 0 && second > hangul_t_base &&
      second < hangul_t_base + hangul_t_count) {
    return first + (second - hangul_t_base);
  }
  const auto* begin = tables::compositions;
  const auto* end = begin + tables::num_compositions;
  const auto* it = std::lower_bound(begin, end, std::pair{first, second},
                                    [](const tables::composition_entry& e, const std::pair<char32_t, char32_t>& key) {
                                      return e.first < key.first || (e.first == key.first && e.second < key.second);
                                    });
  return (it != end && it->first == first && it->second == second) ? it->composite : 0;
}

}  // namespace

std::string nfc_normalize(std::string_view text) {
  // Below U+0300 nothing decomposes, reorders or composes.
  const bool all_low = std::all_of(text.begin(), text.end(), [](char c) {
    const auto b = static_cast<unsigned char>(c);
    return b < 0xCC;  // lead bytes 0xCC and above start code points >= U+0300
  });
  if (all_low) return std::string(text);

  std::vector<char32_t> decomposed;
  decomposed.reserve(text.size());
  for (std::size_t pos = 0; pos < text.size();) decompose(utf8::next(text, pos), decomposed);

  // Canonical ordering: stable sort of each run of non-starters by combining class.
  std::vector<int> classes(decomposed.size());
  for (std::size_t i = 0; i < decomposed.size(); ++i) classes[i] = combining_class(decomposed[i]);
  for (std::size_t i = 0; i < decomposed.size();) {
    if (classes[i] == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < decomposed.size() && classes[j] != 0) ++j;
    if (j - i > 1) {
      std::vector<std::pair<int, char32_t>> run;
      for (std::size_t k = i; k < j; ++k) run.emplace_back(classes[k], decomposed[k]);
      std::stable_sort(run.begin(), run.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (std::size_t k = i; k < j; ++k) {
        classes[k] = run[k - i].first;
        decomposed[k] = run[k - i].second;
      }
    }
    i = j;
  }

  // Canonical composition: a character joins the last starter unless something between them
  // blocks it (a starter, or a character of equal or higher combining class).
  std::vector<char32_t> composed;
  composed.reserve(decomposed.size());
  std::ptrdiff_t starter = -1;
  int last_class = -1;
  for (std::size_t i = 0; i < decomposed.size(); ++i) {
    const char32_t cp = decomposed[i];
    const int cls = classes[i];
    if (starter >= 0) {
      const bool adjacent = static_cast<std::ptrdiff_t>(composed.size()) - 1 == starter;
      if (adjacent || (last_class != 0 && last_class < cls)) {
        if (const char32_t composite = compose_pair(composed[starter], cp); composite != 0) {
          composed[starter] = composite;
          continue;
        }
      }
    }
    if (cls == 0) starter = static_cast<std::ptrdiff_t>(composed.size());
    last_class = cls;
    composed.push_back(cp);
  }

  std::string out;
  out.reserve(text.size());
  for (char32_t cp : composed) utf8::append(out, cp);
  return out;
}

}  // namespace troupe
