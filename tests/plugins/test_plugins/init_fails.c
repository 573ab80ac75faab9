/* A plugin whose init refuses its configuration. */
#include <string.h>

#include <troupe/plugin.h>

TROUPE_PLUGIN_EXPORT int troupe_plugin_init(uint32_t major, uint32_t minor, const char* config, troupe_plugin* out,
                                            troupe_reply* reply) {
  const char* message = "the key 'limit' is required";
  (void)major, (void)minor, (void)config, (void)out;
  reply->set_message(reply, message, strlen(message));
  return 1;
}
