#pragma once
// One plugin instance: its shared library opened, its troupe_plugin_init called with its config,
// the versions checked. Destroying it calls the plugin's destroy, then closes the library.

#include <memory>
#include <string>

#include "include/troupe/plugin.h"
#include "plugins/plugin_spec.hpp"

namespace troupe {

class plugin_library {
 public:
  // Throws std::runtime_error naming the library and what was wrong: it cannot be opened, it has
  // no troupe_plugin_init, its init failed (with the plugin's message), its ABI major differs
  // from the host's or its minor is newer.
  static std::unique_ptr<plugin_library> load(const plugin_spec& spec);
  ~plugin_library();
  plugin_library(const plugin_library&) = delete;
  plugin_library& operator=(const plugin_library&) = delete;

  const troupe_plugin& plugin() const { return plugin_; }
  const std::string& name() const { return name_; }
  const plugin_spec& spec() const { return spec_; }
  // The library fills in the hook's function ("request", "output", "logits" or "route").
  bool implements(const std::string& hook) const;
  // The spec asks for the hook (or for every hook) and the library implements it.
  bool runs(const std::string& hook) const;

 private:
  plugin_library() = default;

  plugin_spec spec_;
  std::string name_;
  void* handle_ = nullptr;  // dlopen's
  troupe_plugin plugin_{};
  bool initialized_ = false;
};

}  // namespace troupe
