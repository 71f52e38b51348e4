/* Under SPLITCOUNT_PRELOAD_CHARGE=footprint a block is charged what it
 * takes from glibc's heap — its chunk, our 16 bytes and glibc's size word
 * included — so a group's usage follows glibc's own count of bytes in use
 * (mallinfo2: uordblks + hblkhd). 20,000 blocks of 1 to 4,000 bytes (one
 * in seven from calloc, one in a thousand of 200 KB or more: mapped), a
 * few hundred over-aligned ones, some grown by realloc; then all freed.
 * Prints the figures; exits 1 if usage strays more than 0.5% from glibc's
 * count or does not return to 0. */
#define _GNU_SOURCE
#include "preload_test.h"

#include <malloc.h>
#include <stdlib.h>

enum { N = 20000 };

static size_t glibc_in_use(void) {
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

int main(void) {
  preload_handles();
  splitcount_group *g = child("footprint");
  static void *p[N];
  size_t before = glibc_in_use();
  OK(splitcount_enter(g));
  unsigned seed = 11;
  for (int i = 0; i < N; i++) {
    seed = seed * 1103515245 + 12345;
    size_t n = 1 + (seed >> 8) % 4000;
    if (i % 1000 == 0) n = 200000 + i;
    if (i % 50 == 0) {
      CHECK(posix_memalign(&p[i], 64 << (i % 4), n) == 0);
    } else {
      p[i] = (i % 7 == 0) ? calloc(1, n) : malloc(n);
    }
    CHECK(p[i] != NULL);
    if (i % 13 == 0) {
      p[i] = realloc(p[i], n * 2 + 100);
      CHECK(p[i] != NULL);
    }
  }
  OK(splitcount_leave());
  uint64_t tracked = usage(g);
  size_t glibc = glibc_in_use() - before;
  double off = ((double)tracked - (double)glibc) / (double)glibc;
  printf("tracked %llu bytes, glibc in use +%zu bytes (%+.3f%%) for %d blocks\n",
         (unsigned long long)tracked, glibc, off * 100.0, N);
  CHECK(off <= 0.005 && off >= -0.005);
  for (int i = 0; i < N; i++) free(p[i]);
  CHECK(usage(g) == 0);
  OK(splitcount_group_remove(g));
  printf("footprint_test: %d checks passed\n", checks);
  return 0;
}
