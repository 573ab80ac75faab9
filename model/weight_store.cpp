#include "model/weight_store.hpp"

#include <stdexcept>

namespace troupe {

void weight_store::add(weight_tensor tensor) {
  std::string name = tensor.name;
  if (!tensors_.emplace(name, std::move(tensor)).second) {
    throw std::runtime_error("duplicate tensor '" + name + "'");
  }
}

const weight_tensor* weight_store::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const weight_tensor& weight_store::get(const std::string& name) const {
  const weight_tensor* tensor = find(name);
  if (!tensor) throw std::runtime_error("model has no tensor '" + name + "'");
  return *tensor;
}

size_t weight_store::total_bytes() const {
  size_t total = 0;
  for (const auto& [name, tensor] : tensors_) total += tensor.num_bytes;
  return total;
}

}  // namespace troupe
