#pragma once
// A node: one process, one CAF actor system, the stages a topology places on it. Colocated, that
// is every stage: frontend, tokenizer pool, scheduler, worker and detokenizer.

#include <memory>

#include "node/topology.hpp"

namespace troupe {

class node {
 public:
  // Loads the model, spawns the stages and binds the frontend; throws std::runtime_error naming
  // what failed.
  explicit node(const topology& t);
  ~node();  // stops the frontend, then the actors
  node(const node&) = delete;
  node& operator=(const node&) = delete;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// Serves until SIGINT or SIGTERM.
void serve_until_signal(const topology& t);

}  // namespace troupe
