/* A plugin whose hooks do nothing (request, output and logits): what a plugin costs the server
 * by itself (bench/plugin_overhead, docs/benchmarks.md), and a plain-C plugin. It claims ABI 1.1
 * (it has no route hook; the host still loads it). With {"abi_minor": 0} in its config it claims
 * ABI 1.0 and fills only the 1.0 hooks, as a library built before the logits hook existed: the
 * host still loads it. */
#include <string.h>

#include <troupe/plugin.h>

static troupe_plugin_status on_request(void* state, const troupe_request* request, troupe_sampling* sampling,
                                       troupe_reply* reply) {
  (void)state, (void)request, (void)sampling, (void)reply;
  return TROUPE_PLUGIN_OK;
}

static troupe_plugin_status on_output(void* state, const troupe_output* output, troupe_reply* reply) {
  (void)state, (void)output, (void)reply;
  return TROUPE_PLUGIN_OK;
}

static troupe_plugin_status on_logits(void* state, const troupe_logits* row, troupe_reply* reply) {
  (void)state, (void)row, (void)reply;
  return TROUPE_PLUGIN_OK;
}

TROUPE_PLUGIN_EXPORT int troupe_plugin_init(uint32_t major, uint32_t minor, const char* config, troupe_plugin* out,
                                            troupe_reply* reply) {
  (void)major, (void)minor, (void)reply;
  const int as_1_0 = config != NULL && strstr(config, "\"abi_minor\": 0") != NULL;
  out->abi_major = TROUPE_PLUGIN_ABI_MAJOR;
  out->abi_minor = as_1_0 ? 0 : 1;
  out->name = "empty";
  out->on_request = on_request;
  out->on_output = on_output;
  if (!as_1_0) out->on_logits = on_logits;
  return 0;
}
