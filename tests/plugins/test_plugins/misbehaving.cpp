// A plugin that misbehaves the way its config says, for the host's tests: {"mode": M} with M one
// of pass, reject, error, throw, sleep (past a 50 ms budget), bad_ids, huge_text, stop,
// rewrite_ids, rewrite_max_tokens, bad_sampling, upper (output: the text in capitals); by_tenant
// (request hook: the mode is the request's tenant). huge_text, stop and upper act only on output.
// The logits hook (ABI 1.1) acts in mode logits_by_prompt only, by the request's first prompt
// token: 10 error, 11 throw, 12 sleep, 13 a NaN logit, 14 every token masked; else it passes.
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>
#include <troupe/plugin.hpp>

namespace {

class misbehaving {
 public:
  explicit misbehaving(std::string_view config) : mode_(nlohmann::json::parse(config).value("mode", "pass")) {}

  static troupe_plugin_status act(const std::string& mode_, troupe::plugin_reply_ref reply) {
    if (mode_ == "reject") {
      reply.message("not today");
      return TROUPE_PLUGIN_REJECT;
    }
    if (mode_ == "stop") {
      reply.message("enough");
      return TROUPE_PLUGIN_STOP;
    }
    if (mode_ == "error") {
      reply.message("the database is down");
      return TROUPE_PLUGIN_ERROR;
    }
    if (mode_ == "throw") throw std::runtime_error("thrown on purpose");
    if (mode_ == "sleep") std::this_thread::sleep_for(std::chrono::milliseconds(120));
    if (mode_ == "bad_ids") reply.prompt_ids({1, 2, 1 << 30});
    if (mode_ == "rewrite_ids") reply.prompt_ids({1, 2, 3});
    if (mode_ == "huge_text") reply.text(std::string(2u << 20, 'x'));
    return TROUPE_PLUGIN_OK;
  }

  troupe_plugin_status on_request(const troupe_request& request, troupe_sampling& sampling,
                                  troupe::plugin_reply_ref reply) {
    const std::string mode = mode_ == "by_tenant" ? std::string(request.tenant, request.tenant_len) : mode_;
    if (mode == "huge_text" || mode == "stop" || mode == "upper") return TROUPE_PLUGIN_OK;
    if (mode == "rewrite_max_tokens") sampling.max_tokens = 3;
    if (mode == "bad_sampling") sampling.top_p = 7;
    return act(mode, reply);
  }
  troupe_plugin_status on_output(const troupe_output& output, troupe::plugin_reply_ref reply) {
    if (mode_ == "upper") {
      std::string text(output.text, output.text_len);
      for (char& c : text) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 32 : c);
      reply.text(text);
      return TROUPE_PLUGIN_OK;
    }
    if (mode_ == "by_tenant") return TROUPE_PLUGIN_OK;
    return act(mode_, reply);
  }

  troupe_plugin_status on_logits(const troupe_logits& row, troupe::plugin_reply_ref reply) {
    if (mode_ != "logits_by_prompt" || row.num_token_ids == 0) return TROUPE_PLUGIN_OK;
    switch (row.token_ids[0]) {
      case 10: return act("error", reply);
      case 11: return act("throw", reply);
      case 12: return act("sleep", reply);
      case 13: row.logits[row.vocab_size / 2] = NAN; return TROUPE_PLUGIN_OK;
      case 14:
        for (size_t i = 0; i < row.vocab_size; ++i) row.logits[i] = -INFINITY;
        return TROUPE_PLUGIN_OK;
      case 15:  // +inf is garbage; the -inf masks beside it are not
        for (size_t i = 0; i + 1 < row.vocab_size; ++i) row.logits[i] = -INFINITY;
        row.logits[3] = INFINITY;
        return TROUPE_PLUGIN_OK;
      case 16:  // one token left unmasked: a valid row
        for (size_t i = 0; i + 1 < row.vocab_size; ++i) row.logits[i] = -INFINITY;
        return TROUPE_PLUGIN_OK;
      default: return TROUPE_PLUGIN_OK;
    }
  }

  // ABI 1.2, in mode route_by_tenant only: the request's tenant says what to do ("error",
  // "throw", "sleep", "index_9", "draining": the first draining candidate, "pick_1"); any other
  // tenant gets no opinion.
  troupe_plugin_status on_route(const troupe_route_request& request, size_t& chosen, troupe::plugin_reply_ref reply) {
    if (mode_ != "route_by_tenant") return TROUPE_PLUGIN_OK;
    const std::string tenant(request.tenant, request.tenant_len);
    if (tenant == "error" || tenant == "throw" || tenant == "sleep") return act(tenant, reply);
    if (tenant == "index_9") chosen = 9;
    if (tenant == "pick_1") chosen = 1;
    if (tenant == "draining") {
      for (size_t i = 0; i < request.num_candidates; ++i) {
        if (request.candidates[i].draining) chosen = i;
      }
    }
    return TROUPE_PLUGIN_OK;
  }

 private:
  std::string mode_;
};

}  // namespace

TROUPE_PLUGIN_CLASS(misbehaving, "misbehaving")
