/* What the C tests under the preload share: handles on the preload's
 * hierarchy and on /preload, groups made under /preload, and a group's
 * usage with nothing left in the stocks — exactly the usable bytes of the
 * blocks charged to it. */
#ifndef SPLITCOUNT_PRELOAD_TEST_H
#define SPLITCOUNT_PRELOAD_TEST_H

#include "check.h"

#include <stdint.h>
#include <stdlib.h>

static splitcount_hierarchy *h;
static splitcount_group *preload_group;

/* Takes the handles above; first thing in main. */
static void preload_handles(void) {
  OK(splitcount_preload_hierarchy(&h));
  OK(splitcount_preload_group(&preload_group));
}

static inline uint64_t usage(splitcount_group *g) {
  uint64_t v = 0;
  OK(splitcount_hierarchy_drain_stocks(h, NULL));
  OK(splitcount_group_usage(g, &v));
  return v;
}

static inline splitcount_group *child(const char *name) {
  splitcount_group *g = NULL;
  OK(splitcount_group_child(preload_group, name, &g));
  return g;
}

/* n blocks of 16 bytes to 4 KB (every 1000th a mapped one of 200 KB), one
 * in seven from calloc and checked zeroed. */
static inline void alloc_mixed_blocks(void **p, int n) {
  unsigned seed = 7;
  for (int i = 0; i < n; i++) {
    seed = seed * 1103515245 + 12345;
    size_t size = 16 + (seed >> 8) % 4000;
    if (i % 1000 == 0) size = 200000 + i;
    p[i] = (i % 7 == 0) ? calloc(1, size) : malloc(size);
    CHECK(p[i] != NULL);
    if (i % 7 == 0) CHECK(((unsigned char *)p[i])[size - 1] == 0);
  }
}

#endif
