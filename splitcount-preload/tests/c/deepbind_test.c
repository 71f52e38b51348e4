/* What RTLD_DEEPBIND does under the preload. The plugin (deepbind_lib.c,
 * its path the first argument) is loaded with RTLD_DEEPBIND, so its own
 * `malloc` and `free` are glibc's, not the preload's. The second argument:
 *
 *   plugin-to-program  the plugin allocates (glibc: a block the preload
 *                      did not make), the program frees it (the preload
 *                      recognizes a foreign block and hands it to glibc):
 *                      works; prints "ok";
 *   program-to-plugin  the program allocates (the preload: a header in
 *                      front of glibc's chunk), the plugin frees it with
 *                      glibc's `free`, which gets a pointer 16 bytes into
 *                      its chunk: glibc aborts ("free(): invalid pointer"
 *                      or "double free or corruption").
 *
 * Built without the preload; the test runs it with it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: deepbind_test <plugin.so> plugin-to-program|program-to-plugin\n");
    return 2;
  }
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_DEEPBIND);
  if (h == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  void *(*plugin_alloc)(size_t) = (void *(*)(size_t))dlsym(h, "plugin_alloc");
  void (*plugin_free)(void *) = (void (*)(void *))dlsym(h, "plugin_free");
  if (plugin_alloc == NULL || plugin_free == NULL) return 2;
  if (strcmp(argv[2], "plugin-to-program") == 0) {
    for (int i = 0; i < 1000; i++) {
      char *p = plugin_alloc(16 + i);
      if (p == NULL) return 1;
      memset(p, 1, 16 + i);
      free(p);
    }
  } else {
    char *p = malloc(100);
    plugin_free(p);
  }
  printf("ok\n");
  return 0;
}
