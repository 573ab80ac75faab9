#include "doors/api_key.hpp"

#include <cstddef>

namespace troupe {

bool api_key_matches(std::string_view given, std::string_view expected) {
  // volatile keeps the compiler from turning the accumulation into an early exit.
  volatile unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    // Past the end of a shorter guess, compare with 0: the length already made diff non-zero.
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff = diff | static_cast<unsigned char>(g ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

}  // namespace troupe
