/* The aligned allocation functions on a table of alignments and sizes,
 * one line per call: whether a block came back, errno (or the result of
 * posix_memalign), whether the block is aligned as glibc aligns it and
 * holds the size. Built without the preload: the test runs it with and
 * without LD_PRELOAD and compares the two outputs line by line, so that
 * the preload answers as the host's glibc does (whatever its version). */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The alignment glibc gives for `align` (memalign's rounding): its own 16
 * for 16 or less, else the next power of two, at least 32. */
static size_t glibc_alignment(size_t align) {
  if (align <= 16) return 16;
  size_t a = 32;
  while (a < align && a != 0) a <<= 1;
  return a;
}

static void show(const char *fn, size_t align, size_t size, void *p, int err) {
  int fits = p != NULL && (uintptr_t)p % glibc_alignment(align) == 0 &&
             malloc_usable_size(p) >= size;
  printf("%s(%zu, %zu): %s errno=%d%s\n", fn, align, size, p ? "block" : "NULL", p ? 0 : err,
         p ? (fits ? " aligned" : " MISALIGNED") : "");
  free(p);
}

int main(void) {
  static const size_t cases[][2] = {
      {0, 16}, {0, 0}, {1, 1}, {2, 3}, {3, 7}, {8, 5}, {16, 16}, {24, 48}, {24, 5},
      {32, 5}, {48, 100}, {64, 0}, {64, 100}, {100, 1000}, {4096, 1}, {4097, 1},
      {1 << 20, 10}, {(size_t)1 << 63, 1}, {((size_t)1 << 63) + 1, 1}, {SIZE_MAX, 1},
      {16, SIZE_MAX}, {64, SIZE_MAX - 100},
  };
  for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t align = cases[i][0], size = cases[i][1];
    errno = 0;
    void *p = aligned_alloc(align, size);
    show("aligned_alloc", align, size, p, errno);
    errno = 0;
    p = memalign(align, size);
    show("memalign", align, size, p, errno);
    errno = 0;
    p = NULL;
    int r = posix_memalign(&p, align, size);
    show("posix_memalign", align, size, r == 0 ? p : NULL, r);
  }
  return 0;
}
