#pragma once
// The plugins one stage runs for one hook, in the order they were configured, each call timed
// against its plugin's budget and its results checked before the stage uses them. A plugin that
// errs, throws, overruns its budget or hands back garbage fails only the request it was called
// for; the message names the plugin. Thread-safe where the plugins are (include/troupe/plugin.h).

#include <cstdint>
#include <memory>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "plugins/plugin_library.hpp"
#include "plugins/plugin_stats.hpp"
#include "protocol/sampling_params.hpp"

namespace troupe {

// Why a hook ended a request.
struct plugin_verdict {
  enum class kind { rejected, stopped, failed };
  kind what = kind::failed;
  std::string plugin;
  std::string message;  // names the plugin: "plugin 'quota' rejected the request: ..."
};

class plugin_chain {
 public:
  // The largest text one output hook call may hand back: more is garbage.
  static constexpr size_t max_output_text_bytes = 1u << 20;

  plugin_chain() = default;
  // Loads every spec and keeps those that run `hook` ("request", "output" or "logits"); throws
  // as plugin_library::load does.
  plugin_chain(const std::vector<plugin_spec>& specs, const std::string& hook);

  bool empty() const { return plugins_.empty(); }

  // The names of the loaded plugins that run `hook`, whichever hook this chain runs: the
  // tokenizer stage refuses a request naming a logits plugin the server does not run.
  std::vector<std::string> names_running(const std::string& hook) const;
  // Whether this chain runs a plugin of that name.
  bool has(const std::string& name) const { return find(name) != nullptr; }

  // The request hooks, one after another: each sees the prompt and parameters the one before
  // left. prompt_ids and sampling are changed in place; a rewritten prompt must be non-empty,
  // inside [0, vocab_size) and shorter than max_model_len, rewritten parameters pass the
  // protocol's check. nullopt: accepted.
  std::optional<plugin_verdict> on_request(int64_t request_id, std::vector<int32_t>& prompt_ids,
                                           const std::string& prompt_text, const std::string& tenant,
                                           sampling_params& sampling, int vocab_size, int max_model_len);

  // The output hooks on one delta's text, in turn (each sees the text the one before left).
  // nullopt: go on with `text`; a `stopped` verdict keeps `text` as the request's last.
  std::optional<plugin_verdict> on_output(int64_t request_id, std::string& text, bool is_final);

  // The logits hooks a request named (`names`, in their order) on its row, each changing `logits`
  // in place; token_ids is the prompt (its first num_prompt_ids) and the outputs so far. A name
  // this chain does not run fails the request. After each hook the row must hold no NaN nor
  // +inf and keep at least one token unmasked (finite), else the request fails (garbage): that
  // scan costs one pass over the row per hook.
  std::optional<plugin_verdict> on_logits(const std::vector<std::string>& names, int64_t request_id,
                                          std::span<const int32_t> token_ids, size_t num_prompt_ids,
                                          std::span<float> logits);

  // The route hooks on a request being dispatched (request->candidates non-empty), in order until
  // one has an opinion: its choice, an index into the candidates; nullopt for no opinion. An
  // error, a throw, an overrun, an index past the candidates or one of a draining candidate
  // fails the request (the verdict, kind failed).
  struct route_answer {
    std::optional<size_t> chosen;
    std::optional<plugin_verdict> failure;
  };
  route_answer on_route(const troupe_route_request& request);

  // The request ended (any way): every plugin drops what it kept for it.
  void end_request(int64_t request_id);
  // The same for the named plugins only (a logits request's).
  void end_request(int64_t request_id, const std::vector<std::string>& names);

  // One entry per plugin, named, for /metrics.
  std::vector<plugin_counters> counters() const;

 private:
  struct entry {
    std::unique_ptr<plugin_library> library;
    std::unique_ptr<plugin_stats> stats;
  };

  entry* find(const std::string& name);
  const entry* find(const std::string& name) const;

  std::string hook_;
  std::vector<entry> plugins_;
  std::map<std::string, std::vector<std::string>> names_by_hook_;  // every loaded plugin's, by hook
};

}  // namespace troupe
