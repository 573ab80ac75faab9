// Tenant affinity: a route-hook plugin (ABI 1.2), in C++ over the header-only wrapper
// (troupe/plugin.hpp), that pins each tenant to one engine instance, so that a tenant's requests
// share that instance's prefix cache (a long system prompt per tenant is computed once) and one
// tenant's burst stays on its instance instead of spreading over every one.
//
// A template to copy. What it shows:
//  - choosing a candidate by its index, or giving no opinion (the router's own policy decides);
//  - stable placement: a new tenant goes where a rendezvous hash of (tenant, instance id) is
//    highest among the instances that take requests, so adding an instance moves only the
//    tenants that now hash to it, and every controller run pins a tenant the same way;
//  - fallback: when a tenant's instance is gone or draining, the tenant moves to the least
//    loaded instance (by the router's count of its requests, then its queued prompt tokens) and
//    stays there;
//  - state across requests without a lock: the router calls its route hook from one thread.
//
// The tenant is the request's `tenant` field (OpenAI's `user`), or the [[tenants]] tenant whose
// API key the request carries. Configuration: {"max_tenants": 65536, "anonymous": "balance"}:
// max_tenants bounds the pins kept (when full they are forgotten and tenants pinned again, by
// the same hash); anonymous: "balance" leaves requests without a tenant to the router's policy,
// "pin" pins them all as one tenant.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <troupe/plugin.hpp>

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer: every input bit moves every output bit
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_of(const std::string& text) {  // FNV-1a: the same on every run and machine
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

class tenant_affinity {
 public:
  explicit tenant_affinity(std::string_view config_json) {
    const auto config = nlohmann::json::parse(config_json);
    max_tenants_ = config.value("max_tenants", int64_t{65536});
    const std::string anonymous = config.value("anonymous", std::string("balance"));
    if (max_tenants_ < 1) throw std::runtime_error("max_tenants must be at least 1");
    if (anonymous != "balance" && anonymous != "pin")
      throw std::runtime_error("anonymous must be \"balance\" or \"pin\"");
    pin_anonymous_ = anonymous == "pin";
  }

  troupe_plugin_status on_route(const troupe_route_request& request, size_t& chosen, troupe::plugin_reply_ref) {
    const std::string tenant(request.tenant, request.tenant_len);
    if (tenant.empty() && !pin_anonymous_) return TROUPE_PLUGIN_OK;  // no opinion
    auto pin = pins_.find(tenant);
    if (pin != pins_.end()) {
      for (size_t i = 0; i < request.num_candidates; ++i) {
        const troupe_route_candidate& c = request.candidates[i];
        if (c.instance_id == pin->second && !c.draining) {
          chosen = i;
          return TROUPE_PLUGIN_OK;
        }
      }
      // Its instance is gone or draining: the tenant moves to the least loaded one, for good.
      const size_t least = least_loaded(request);
      if (least == TROUPE_ROUTE_NO_OPINION) return TROUPE_PLUGIN_OK;
      pin->second = request.candidates[least].instance_id;
      chosen = least;
      return TROUPE_PLUGIN_OK;
    }
    const size_t hashed = highest_hash(request, hash_of(tenant));
    if (hashed == TROUPE_ROUTE_NO_OPINION) return TROUPE_PLUGIN_OK;
    if (static_cast<int64_t>(pins_.size()) >= max_tenants_) pins_.clear();
    pins_.emplace(tenant, request.candidates[hashed].instance_id);
    chosen = hashed;
    return TROUPE_PLUGIN_OK;
  }

 private:
  // Rendezvous hashing over the instances that take requests; NO_OPINION when none does.
  static size_t highest_hash(const troupe_route_request& request, uint64_t tenant_hash) {
    size_t best = TROUPE_ROUTE_NO_OPINION;
    uint64_t best_weight = 0;
    for (size_t i = 0; i < request.num_candidates; ++i) {
      const troupe_route_candidate& c = request.candidates[i];
      if (c.draining) continue;
      const uint64_t weight = mix(tenant_hash ^ mix(static_cast<uint64_t>(c.instance_id)));
      if (best == TROUPE_ROUTE_NO_OPINION || weight > best_weight) {
        best = i;
        best_weight = weight;
      }
    }
    return best;
  }

  static size_t least_loaded(const troupe_route_request& request) {
    size_t best = TROUPE_ROUTE_NO_OPINION;
    for (size_t i = 0; i < request.num_candidates; ++i) {
      const troupe_route_candidate& c = request.candidates[i];
      if (c.draining) continue;
      if (best == TROUPE_ROUTE_NO_OPINION) {
        best = i;
        continue;
      }
      const troupe_route_candidate& b = request.candidates[best];
      if (c.num_requests < b.num_requests ||
          (c.num_requests == b.num_requests && c.num_queued_prompt_tokens < b.num_queued_prompt_tokens)) {
        best = i;
      }
    }
    return best;
  }

  int64_t max_tenants_ = 65536;
  bool pin_anonymous_ = false;
  std::unordered_map<std::string, int32_t> pins_;  // tenant → instance id
};

}  // namespace

TROUPE_PLUGIN_CLASS(tenant_affinity, "tenant-affinity")
