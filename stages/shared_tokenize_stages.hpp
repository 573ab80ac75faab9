#pragma once
// The tokenize_stage that a process's tokenizer actors built from the same spec share: a pool
// loads its tokenizer (and its request plugins) once, whether the controller spawns it for itself
// or a node for a controller, with each actor built from its spec alone. Held weakly: a stage
// goes with the last actor that uses it, and the next spawn loads it again.

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "stages/tokenize_stage.hpp"

namespace troupe {

class shared_tokenize_stages {
 public:
  // The live stage made for `key` (what the stage is made of: the same key, the same stage), or
  // the one `make` makes now, kept for the next. Thread-safe: a caller waits while another's
  // `make` runs, so a pool spawned at once loads once. `make`'s exception reaches the caller and
  // nothing is kept.
  std::shared_ptr<const tokenize_stage> get(const std::string& key,
                                            const std::function<std::shared_ptr<const tokenize_stage>()>& make);

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::weak_ptr<const tokenize_stage>> stages_;  // guarded by mutex_
};

}  // namespace troupe
