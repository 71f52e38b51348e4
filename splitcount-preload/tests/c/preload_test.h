/* What the C tests under the preload share: handles on the preload's
 * hierarchy and on /preload, groups made under /preload, and a group's
 * usage with nothing left in the stocks — exactly the usable bytes of the
 * blocks charged to it. */
#ifndef SPLITCOUNT_PRELOAD_TEST_H
#define SPLITCOUNT_PRELOAD_TEST_H

#include "check.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

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

static volatile int churning;

static inline void *churn(void *arg) {
  (void)arg;
  while (churning) {
    void *p[16];
    for (int i = 0; i < 16; i++) p[i] = malloc(64 + i * 512);
    for (int i = 0; i < 16; i++) free(p[i]);
  }
  return NULL;
}

/* Three threads allocating and freeing until stop_churn. */
static inline void start_churn(pthread_t th[3]) {
  churning = 1;
  for (int i = 0; i < 3; i++) CHECK(pthread_create(&th[i], NULL, churn, NULL) == 0);
}

static inline void stop_churn(pthread_t th[3]) {
  churning = 0;
  for (int i = 0; i < 3; i++) CHECK(pthread_join(th[i], NULL) == 0);
}

/* n fork children, one at a time, each running child() and exiting with
 * its result, which must be 0 (a child stuck for 20 s is killed). */
static inline void fork_children(int n, int (*child)(void)) {
  for (int k = 0; k < n; k++) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
      alarm(20);
      _exit(child());
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
}

#endif
