/* What over-aligned blocks cost in resident memory: for each case, 20,000
 * blocks from posix_memalign, each written once, then the growth of the
 * process's resident set (VmRSS) in KiB, one line per case. Built without
 * the preload: the test runs it with and without LD_PRELOAD and compares
 * the two (a header in front of an aligned block used to take a whole
 * alignment unit: 4096-aligned blocks of 100 bytes cost twice the RSS). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCKS = 20000 };

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) kib = strtol(line + 6, NULL, 10);
  if (f) fclose(f);
  return kib;
}

int main(void) {
  static const size_t cases[][2] = {{4096, 100}, {4096, 4096}, {64, 48}, {256, 1000}};
  static void *blocks[BLOCKS];
  for (unsigned c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    size_t align = cases[c][0], size = cases[c][1];
    long before = rss_kib();
    for (int i = 0; i < BLOCKS; i++) {
      if (posix_memalign(&blocks[i], align, size) != 0) {
        fprintf(stderr, "posix_memalign(%zu, %zu) failed\n", align, size);
        return 1;
      }
      memset(blocks[i], 0x5a, size);
    }
    long grown = rss_kib() - before;
    for (int i = 0; i < BLOCKS; i++) free(blocks[i]);
    printf("posix_memalign(%zu, %zu) x %d: rss_kib=%ld\n", align, size, BLOCKS, grown);
  }
  return 0;
}
