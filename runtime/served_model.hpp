#pragma once
// A model loaded for serving: its weights (which the model views), the model with its KV pool,
// and the tokenizer, sized from a topology.

#include <memory>

#include "engine/backend_selection.hpp"
#include "kernels/loader/model_loader.hpp"
#include "kernels/model.hpp"
#include "runtime/text/tokenizer.hpp"
#include "runtime/topology.hpp"

namespace troupe {

struct served_model {
  loaded_model loaded;            // must outlive `model`
  std::unique_ptr<troupe::model> backend_model;
  device_kind device = device_kind::cpu;  // where backend_model runs (after any fallback)
  std::unique_ptr<tokenizer> tok;
  int max_model_len = 0;
};

// Throws std::runtime_error naming the path or setting that is wrong.
std::shared_ptr<served_model> load_served_model(const topology& t);

}  // namespace troupe
