#include "plugins/plugin_library.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <stdexcept>

#include "plugins/plugin_reply.hpp"

namespace troupe {

std::unique_ptr<plugin_library> plugin_library::load(const plugin_spec& spec) {
  validate(spec);
  std::unique_ptr<plugin_library> lib(new plugin_library);
  lib->spec_ = spec;
  const std::string who = "plugin library " + spec.library;
  // RTLD_LOCAL: two plugins may define the same symbols; each sees its own.
  lib->handle_ = dlopen(spec.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle_) {
    const char* why = dlerror();
    throw std::runtime_error(who + ": cannot be loaded: " + (why ? why : "unknown error"));
  }
  dlerror();
  auto init = reinterpret_cast<troupe_plugin_init_fn>(dlsym(lib->handle_, TROUPE_PLUGIN_INIT_SYMBOL));
  if (!init) {
    throw std::runtime_error(who + ": exports no " + TROUPE_PLUGIN_INIT_SYMBOL +
                             " (is it a Troupe plugin, built against include/troupe/plugin.h?)");
  }
  plugin_reply reply;
  int rc = 0;
  try {
    rc = init(TROUPE_PLUGIN_ABI_MAJOR, TROUPE_PLUGIN_ABI_MINOR, spec.config_json.c_str(), &lib->plugin_, &reply.c);
  } catch (...) {
    throw std::runtime_error(who + ": troupe_plugin_init threw an exception (a plugin must return an error instead)");
  }
  if (rc != 0) {
    lib->plugin_ = {};  // a failed init owns no state: nothing to destroy
    throw std::runtime_error(
        who + ": troupe_plugin_init failed: " + (reply.message.empty() ? "no reason given" : reply.message));
  }
  lib->initialized_ = true;
  const troupe_plugin& p = lib->plugin_;
  if (p.abi_major != TROUPE_PLUGIN_ABI_MAJOR || p.abi_minor > TROUPE_PLUGIN_ABI_MINOR) {
    throw std::runtime_error(who + ": built for plugin ABI " + std::to_string(p.abi_major) + "." +
                             std::to_string(p.abi_minor) + ", but this server has ABI " +
                             std::to_string(TROUPE_PLUGIN_ABI_MAJOR) + "." + std::to_string(TROUPE_PLUGIN_ABI_MINOR) +
                             " (the major must match, the minor be at most the server's)");
  }
  lib->name_ = !spec.name.empty() ? spec.name : (p.name && *p.name ? std::string(p.name) : spec.library);
  // A plugin built against an older minor never wrote the hooks added since (on_logits in 1.1,
  // on_route in 1.2): the host's zeroed struct keeps them NULL.
  if (!p.on_request && !p.on_output && !p.on_logits && !p.on_route) {
    throw std::runtime_error(who + ": implements no hook (on_request, on_output, on_logits and on_route are all NULL)");
  }
  for (const std::string& hook : spec.hooks) {
    if (!lib->implements(hook)) {
      throw std::runtime_error(who + ": the configuration asks for its " + hook + " hook, which it does not implement");
    }
  }
  return lib;
}

bool plugin_library::implements(const std::string& hook) const {
  return (hook == "request" && plugin_.on_request) || (hook == "output" && plugin_.on_output) ||
         (hook == "logits" && plugin_.on_logits) || (hook == "route" && plugin_.on_route);
}

bool plugin_library::runs(const std::string& hook) const {
  const bool implemented = implements(hook);
  const bool asked =
      spec_.hooks.empty() || std::find(spec_.hooks.begin(), spec_.hooks.end(), hook) != spec_.hooks.end();
  return implemented && asked;
}

plugin_library::~plugin_library() {
  if (initialized_ && plugin_.destroy) {
    try {
      plugin_.destroy(plugin_.state);
    } catch (...) {
      // Nothing to fail any more: the plugin is going away.
    }
  }
  if (handle_) dlclose(handle_);
}

}  // namespace troupe
