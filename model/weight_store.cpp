#include "model/weight_store.hpp"

#include <malloc.h>

#include <set>
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
  if (tensor->data == nullptr && tensor->num_bytes > 0) {
    throw std::runtime_error("tensor '" + name +
                             "' was released after a backend repacked it (weight_store::release_copies)");
  }
  return *tensor;
}

size_t weight_store::release_copies(const std::vector<std::string>& names) {
  size_t freed = 0;
  for (const std::string& name : names) {
    auto it = tensors_.find(name);
    if (it == tensors_.end() || it->second.owned_copy == nullptr) continue;
    it->second.owned_copy.reset();  // the last reference once every part of the copy is released
    it->second.data = nullptr;
    freed += it->second.num_bytes;
  }
  // The copies were a few MB each: glibc may have placed them in its heap, where a freed block
  // stays resident until trimmed.
  if (freed > 0) malloc_trim(0);
  return freed;
}

size_t weight_store::keep_only(const std::vector<std::string>& names) {
  const std::set<std::string> kept(names.begin(), names.end());
  size_t forgotten = 0;
  for (auto it = tensors_.begin(); it != tensors_.end();) {
    if (kept.count(it->first) != 0) {
      ++it;
      continue;
    }
    forgotten += it->second.num_bytes;
    it = tensors_.erase(it);
  }
  if (forgotten > 0) malloc_trim(0);
  return forgotten;
}

size_t weight_store::total_bytes() const {
  size_t total = 0;
  for (const auto& [name, tensor] : tensors_) total += tensor.num_bytes;
  return total;
}

}  // namespace troupe
