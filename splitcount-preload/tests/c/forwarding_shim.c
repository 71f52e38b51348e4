/* A malloc wrapper of the kind tracing tools preload (memusage,
 * heaptrack): it defines malloc and free and forwards every call to the
 * next definition in lookup order (dlsym(RTLD_NEXT)), counting them.
 * Preloaded ahead of the preload, the process's malloc is the shim's, yet
 * every call still reaches the preload. Built as a shared library by the
 * test. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

static unsigned long calls;

void *malloc(size_t size) {
  static void *(*next)(size_t);
  if (next == NULL) next = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
  calls++;
  return next(size);
}

void free(void *p) {
  static void (*next)(void *);
  if (next == NULL) next = (void (*)(void *))dlsym(RTLD_NEXT, "free");
  calls++;
  next(p);
}
