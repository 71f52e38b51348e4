/* A C program that ignores NULL: under SPLITCOUNT_PRELOAD_MAX it asks for
 * `count` blocks of 1 KiB (argv[1]; 100,000 by default) and keeps asking
 * after malloc returned NULL. Checks, with /preload's usage drained before
 * and after:
 *   - every NULL comes with errno == ENOMEM;
 *   - once one is refused, every later allocation is refused too (nothing
 *     is freed meanwhile): malloc, calloc, realloc's growth (the block left
 *     as it was), posix_memalign (ENOMEM), aligned_alloc, memalign;
 *   - usage is exactly what it was plus the usable bytes of the blocks
 *     handed out: no block escaped the accounting;
 *   - after some blocks are freed, a growth that fits is granted and
 *     malloc succeeds again.
 * Prints one line of key=value figures for the test to compare with the
 * limit ("strict_limit_test: max=... handed=... held=..."), then
 * "strict_limit_test: N checks passed", and exits 0. */
#define _GNU_SOURCE
#include "preload_test.h"

#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <string.h>

enum { BLOCK = 1024, FREED = 16 };

/* Past the limit (the last 1 KiB block did not fit), every function
 * refuses a block that size: NULL and errno ENOMEM (posix_memalign:
 * ENOMEM returned); a realloc that grows a block leaves it as it was. */
static void everything_is_refused(void **some_block) {
  errno = 0;
  CHECK(malloc(BLOCK) == NULL && errno == ENOMEM);
  errno = 0;
  CHECK(calloc(1, BLOCK) == NULL && errno == ENOMEM);
  errno = 0;
  CHECK(aligned_alloc(64, BLOCK) == NULL && errno == ENOMEM);
  errno = 0;
  CHECK(memalign(4096, BLOCK) == NULL && errno == ENOMEM);
  void *p = NULL;
  CHECK(posix_memalign(&p, 64, BLOCK) == ENOMEM && p == NULL);
  if (*some_block != NULL) {
    memset(*some_block, 0x5A, BLOCK);
    errno = 0;
    CHECK(realloc(*some_block, 64 * BLOCK) == NULL && errno == ENOMEM);
    CHECK(((unsigned char *)*some_block)[BLOCK - 1] == 0x5A);
  }
}

int main(int argc, char **argv) {
  preload_handles();
  long count = argc > 1 ? atol(argv[1]) : 100000;
  uint64_t max = 0;
  OK(splitcount_group_max(preload_group, &max));
  /* stdout's buffer (if the limit lets it be) before the baseline. */
  printf("strict_limit_test: %ld blocks of %d bytes, max=%llu\n", count, BLOCK,
         (unsigned long long)max);
  fflush(stdout);

  /* The table of blocks is the test's, not the program's under test:
   * glibc's own (so that even a limit of 1 byte leaves room for it). */
  extern void *__libc_malloc(size_t);
  void **blocks = __libc_malloc(count * sizeof *blocks);
  CHECK(blocks != NULL);
  uint64_t before = usage(preload_group);

  long handed = 0, refused = 0, after_refusal = 0, first_refusal = -1;
  int bad_errno = 0;
  for (long i = 0; i < count; i++) {
    errno = 0;
    void *p = malloc(BLOCK);
    if (p == NULL) {
      refused++;
      if (errno != ENOMEM) bad_errno++;
      if (first_refusal < 0) first_refusal = i;
      continue;
    }
    memset(p, 0xA5, BLOCK); /* really held */
    if (first_refusal >= 0) after_refusal++;
    blocks[handed++] = p;
  }
  long flood_handed = handed;
  size_t held = 0;
  for (long i = 0; i < handed; i++) held += malloc_usable_size(blocks[i]);
  uint64_t after = usage(preload_group);
  struct mallinfo2 m = mallinfo2();

  CHECK(bad_errno == 0);
  CHECK(after_refusal == 0);
  CHECK(after == before + held);
  void *none = NULL;
  if (refused > 0) everything_is_refused(handed > 0 ? &blocks[0] : &none);
  CHECK(usage(preload_group) == after);

  /* Usage falls: allocations succeed again, as many as fit. First three
   * blocks' worth: a block's growth by less than that fits, and is granted
   * (realloc charges the growth plus the heap's rounding beforehand — tens
   * of bytes, not a page: with a page it was refused here). */
  long again = 0;
  if (handed >= FREED) {
    for (long i = 0; i < 3; i++) free(blocks[--handed]);
    errno = 0;
    void *grown = realloc(blocks[0], BLOCK + BLOCK / 2);
    CHECK(grown != NULL && errno == 0);
    if (grown != NULL) blocks[0] = grown;
    for (long i = 3; i < FREED; i++) free(blocks[--handed]);
    for (long i = 0; i < FREED / 2; i++) {
      void *p = malloc(BLOCK);
      CHECK(p != NULL);
      blocks[handed++] = p;
      again++;
    }
  }
  for (long i = 0; i < handed; i++) free(blocks[i]);
  CHECK(usage(preload_group) == before);

  printf("strict_limit_test: max=%llu attempts=%ld handed=%ld refused=%ld "
         "first_refusal=%ld held=%zu usage_before=%llu usage_after=%llu "
         "again=%ld glibc_in_use=%zu\n",
         (unsigned long long)max, count, flood_handed,
         refused, first_refusal, held, (unsigned long long)before,
         (unsigned long long)after, again, m.uordblks + m.hblkhd);
  printf("strict_limit_test: %d checks passed\n", checks);
  return 0;
}
