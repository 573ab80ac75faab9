#pragma once
// A pipeline stage of a model for the tests of issue 27: its own load (only its tensors) and its
// CPU model with an f32 KV pool, one compute thread.

#include <memory>
#include <string>

#include "backends/cpu/cpu_model.hpp"
#include "model/layer_range.hpp"
#include "model/loader/model_loader.hpp"

namespace troupe::test {

struct loaded_stage {
  std::unique_ptr<loaded_model> loaded;  // must outlive `m`, which views its weights
  std::unique_ptr<model> m;
};

inline loaded_stage load_stage(const std::string& path, layer_range layers, kv_cache_shape kv) {
  load_options options{path};
  options.show_progress = false;
  options.layers = layers;
  loaded_stage s;
  s.loaded = std::make_unique<loaded_model>(load_model(options));
  s.m = make_cpu_model(s.loaded->config, s.loaded->weights, kv, 1, dtype::f32, layers);
  return s;
}

}  // namespace troupe::test
