/* What the C tests under the preload share: handles on the preload's
 * hierarchy and on /preload, groups made under /preload, and a group's
 * usage with nothing left in the stocks — exactly the usable bytes of the
 * blocks charged to it. */
#ifndef SPLITCOUNT_PRELOAD_TEST_H
#define SPLITCOUNT_PRELOAD_TEST_H

#include "check.h"

#include <stdint.h>

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

#endif
