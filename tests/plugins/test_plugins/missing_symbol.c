/* A shared library that exports no troupe_plugin_init (a typo in its name). */
#include <troupe/plugin.h>

TROUPE_PLUGIN_EXPORT int troupe_plugin_initialize(void) { return 0; }
