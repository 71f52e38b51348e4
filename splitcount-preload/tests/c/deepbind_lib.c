/* A plugin that `deepbind_test.c` loads with RTLD_DEEPBIND: its `malloc`
 * and `free` bind to glibc's own, not to the preload's. */
#include <stdlib.h>

void *plugin_alloc(size_t n) { return malloc(n); }
void plugin_free(void *p) { free(p); }
