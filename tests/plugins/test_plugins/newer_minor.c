/* A plugin built against a newer minor version than the host's: refused. */
#include <troupe/plugin.h>

static troupe_plugin_status on_output(void* state, const troupe_output* output, troupe_reply* reply) {
  (void)state, (void)output, (void)reply;
  return TROUPE_PLUGIN_OK;
}

TROUPE_PLUGIN_EXPORT int troupe_plugin_init(uint32_t major, uint32_t minor, const char* config, troupe_plugin* out,
                                            troupe_reply* reply) {
  (void)major, (void)minor, (void)config, (void)reply;
  out->abi_major = TROUPE_PLUGIN_ABI_MAJOR;
  out->abi_minor = TROUPE_PLUGIN_ABI_MINOR + 1;
  out->on_output = on_output;
  return 0;
}
