// The doors' one API-key comparison: exact matches only, whatever differs and wherever.

#include <gtest/gtest.h>

#include <string>

#include "doors/api_key.hpp"

namespace troupe {
namespace {

TEST(api_key, matches_only_the_exact_key) {
  const std::string key = "s3cret-key";
  EXPECT_TRUE(api_key_matches("s3cret-key", key));
  EXPECT_FALSE(api_key_matches("S3cret-key", key));            // first byte
  EXPECT_FALSE(api_key_matches("s3cret-kez", key));            // last byte
  EXPECT_FALSE(api_key_matches("s3cret-ke", key));             // a prefix
  EXPECT_FALSE(api_key_matches("s3cret-key ", key));           // the key and more
  EXPECT_FALSE(api_key_matches("s3cret-keys3cret-key", key));  // the key twice
  EXPECT_FALSE(api_key_matches("", key));
  EXPECT_FALSE(api_key_matches(key, ""));
  EXPECT_TRUE(api_key_matches("", ""));
}

TEST(api_key, a_longer_guess_that_repeats_the_key_is_refused) {
  // A comparison that wraps around the expected key (i % size) must still see the length.
  EXPECT_FALSE(api_key_matches("abab", "ab"));
  EXPECT_FALSE(api_key_matches("ab", "abab"));
}

TEST(api_key, bytes_are_compared_whole) {
  // Keys are bytes: a NUL or a high byte inside the key counts like any other.
  const std::string with_nul("a\0b", 3);
  EXPECT_TRUE(api_key_matches(with_nul, with_nul));
  EXPECT_FALSE(api_key_matches(std::string("a\0c", 3), with_nul));
  EXPECT_FALSE(api_key_matches("a", with_nul));
  EXPECT_FALSE(api_key_matches("\xff", "\x7f"));
}

}  // namespace
}  // namespace troupe
