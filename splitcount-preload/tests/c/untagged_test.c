/* A C program under the preload with SPLITCOUNT_PRELOAD_TAGS=off (linked
 * with the library, so that it calls the C API directly). Checks, in
 * order: blocks from before main, usage that tracks the blocks held
 * exactly, no byte per block (glibc's chunks as without the preload),
 * realloc, aligned blocks, a limit that refuses (realloc's growth included,
 * on mimalloc's rounded large blocks too), sizes past PTRDIFF_MAX, threads
 * with cross-thread
 * frees, fork while threads allocate, and that entering a group is refused
 * with a reason. Prints
 * "untagged_test: N checks passed" and exits 0. */
#define _GNU_SOURCE
#include "preload_test.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

/* Allocated before main (by a constructor), freed in main. */
static void *early[64];

__attribute__((constructor)) static void before_main(void) {
  for (int i = 0; i < 64; i++) early[i] = malloc(32 + i * 100);
}

static int on_glibc(void) {
  const char *inner = getenv("SPLITCOUNT_PRELOAD_INNER");
  return inner == NULL || inner[0] == '\0' || strcasecmp(inner, "glibc") == 0;
}

static void blocks_from_before_main_are_freed(void) {
  uint64_t before = usage(preload_group);
  size_t held = 0;
  for (int i = 0; i < 64; i++) {
    CHECK(early[i] != NULL);
    CHECK(malloc_usable_size(early[i]) >= (size_t)(32 + i * 100));
    held += malloc_usable_size(early[i]);
    free(early[i]);
  }
  CHECK(usage(preload_group) == before - held);
}

/* 20,000 blocks, small and mapped, malloc and calloc: /preload's usage
 * grows by their usable sizes exactly and falls back when they are freed. */
static void usage_tracks_the_blocks_held(void) {
  enum { N = 20000 };
  static void *p[N];
  uint64_t before = usage(preload_group);
  alloc_mixed_blocks(p, N);
  size_t held = 0;
  for (int i = 0; i < N; i++) held += malloc_usable_size(p[i]);
  uint64_t tracked = usage(preload_group) - before;
  printf("tracked %llu bytes, held (malloc_usable_size) %zu bytes for %d blocks\n",
         (unsigned long long)tracked, held, N);
  CHECK(tracked == held);
  for (int i = 0; i < N; i++) free(p[i]);
  CHECK(usage(preload_group) == before);
}

/* 100,000 blocks of 24 bytes take 32 bytes each of glibc's heap, as they
 * do without the preload (with tags: 48); malloc_usable_size says 24. */
static void no_byte_per_block(void) {
  enum { N = 100000 };
  static void *p[N];
  /* glibc counts the chunks in its per-thread cache as in use: empty the
   * cache of this size first, so that every block below takes a chunk. */
  void *cached[7];
  for (int i = 0; i < 7; i++) cached[i] = malloc(24);
  struct mallinfo2 m0 = mallinfo2();
  for (int i = 0; i < N; i++) {
    p[i] = malloc(24);
    CHECK(p[i] != NULL);
  }
  struct mallinfo2 m1 = mallinfo2();
  size_t per_block = (m1.uordblks - m0.uordblks + N / 2) / N;
  printf("24-byte blocks: %zu bytes of glibc's heap each, usable %zu\n", per_block,
         malloc_usable_size(p[0]));
  if (on_glibc()) {
    CHECK(per_block == 32);
    CHECK(malloc_usable_size(p[0]) == 24);
  }
  for (int i = 0; i < N; i++) free(p[i]);
  for (int i = 0; i < 7; i++) free(cached[i]);
}

static void realloc_is_charged_its_new_size(void) {
  uint64_t before = usage(preload_group);
  char *p = malloc(100);
  CHECK(p != NULL);
  memset(p, 7, 100);
  for (size_t n = 200; n <= (8u << 20); n *= 3) {
    p = realloc(p, n);
    CHECK(p != NULL && p[99] == 7);
    CHECK(usage(preload_group) - before == malloc_usable_size(p));
  }
  p = realloc(p, 50);
  CHECK(p != NULL && p[49] == 7);
  CHECK(usage(preload_group) - before == malloc_usable_size(p));
  free(p);
  CHECK(usage(preload_group) == before);
}

/* The address of a block, through a volatile: the compiler may not assume
 * the alignment an allocation function promises (it folds the check). */
static uintptr_t address_of(void *p) {
  volatile uintptr_t a = (uintptr_t)p;
  return a;
}

/* An alignment of 16 is kept for the smallest blocks too: jemalloc's and
 * mimalloc's 8-byte class is 8-aligned, and such requests went to their
 * plain malloc (every other block of 4 bytes asked for at 16 came back at
 * ...8). */
static void small_blocks_at_16_are_16_aligned(void) {
  uint64_t before = usage(preload_group);
  for (size_t size = 1; size <= 40; size++) {
    void *b[3];
    CHECK(posix_memalign(&b[0], 16, size) == 0);
    b[1] = aligned_alloc(16, size);
    b[2] = memalign(16, size);
    for (int i = 0; i < 3; i++) {
      CHECK(b[i] != NULL && address_of(b[i]) % 16 == 0);
      CHECK(malloc_usable_size(b[i]) >= size);
    }
    for (int i = 0; i < 3; i++) free(b[i]);
  }
  CHECK(usage(preload_group) == before);
}

static void aligned_blocks_are_aligned_and_charged(void) {
  uint64_t before = usage(preload_group);
  size_t held = 0;
  void *b[5];
  CHECK(posix_memalign(&b[0], 64, 48) == 0);
  CHECK(posix_memalign(&b[1], 4096, 100) == 0);
  b[2] = aligned_alloc(256, 1000);
  b[3] = memalign(128, 5000);
  b[4] = valloc(10);
  for (int i = 0; i < 5; i++) {
    CHECK(b[i] != NULL);
    held += malloc_usable_size(b[i]);
  }
  CHECK((uintptr_t)b[0] % 64 == 0 && (uintptr_t)b[1] % 4096 == 0);
  CHECK((uintptr_t)b[2] % 256 == 0 && (uintptr_t)b[3] % 128 == 0);
  CHECK((uintptr_t)b[4] % 4096 == 0);
  CHECK(usage(preload_group) - before == held);
  b[3] = realloc(b[3], 9000);
  CHECK(b[3] != NULL);
  for (int i = 0; i < 5; i++) free(b[i]);
  CHECK(usage(preload_group) == before);
}

/* Growing a block by realloc never takes usage past a refusing limit, on
 * any heap: mimalloc's large blocks are rounded far beyond mi_good_size
 * (142,286 bytes: 196,608 usable), so a growth charged beforehand by that
 * bound was forced past the limit. */
static void realloc_never_passes_the_limit(void) {
  uint64_t before = usage(preload_group);
  /* A small block grown at once to sizes mimalloc rounds up the most,
   * under a limit just above the size asked for. */
  static const size_t picked[] = {142286, 542919, 900000};
  for (int k = 0; k < 3; k++) {
    uint64_t max = before + picked[k] + 8192;
    OK(splitcount_group_set_max(preload_group, max));
    char *p = malloc(16);
    CHECK(p != NULL);
    p[0] = 42;
    errno = 0;
    char *q = realloc(p, picked[k]);
    if (q == NULL) {
      CHECK(errno == ENOMEM && p[0] == 42);
      q = p;
    }
    CHECK(q[0] == 42);
    CHECK(usage(preload_group) <= max);
    free(q);
  }
  /* A block grown step by step until a limit 1 MiB up refuses. */
  uint64_t max = before + (1 << 20);
  OK(splitcount_group_set_max(preload_group, max));
  char *p = malloc(16);
  CHECK(p != NULL);
  p[0] = 42;
  for (size_t n = 100; n < (4u << 20); n = n * 137 / 100 + 1) {
    errno = 0;
    char *q = realloc(p, n);
    if (q == NULL) {
      CHECK(errno == ENOMEM && p[0] == 42);
      break;
    }
    p = q;
    CHECK(p[0] == 42);
    CHECK(usage(preload_group) <= max);
  }
  free(p);
  OK(splitcount_group_set_max(preload_group, UINT64_MAX));
  CHECK(usage(preload_group) == before);
}

/* Sizes past PTRDIFF_MAX are refused with ENOMEM, as glibc refuses them. */
static void huge_sizes_are_refused_with_enomem(void) {
  const size_t huge[] = {(size_t)1 << 63, SIZE_MAX - 4096, SIZE_MAX};
  for (int i = 0; i < 3; i++) {
    errno = 0;
    CHECK(malloc(huge[i]) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc(1, huge[i]) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(memalign(64, huge[i]) == NULL && errno == ENOMEM);
    char *p = malloc(10);
    CHECK(p != NULL);
    p[0] = 7;
    errno = 0;
    CHECK(realloc(p, huge[i]) == NULL && errno == ENOMEM && p[0] == 7);
    free(p);
  }
}

/* A limit on /preload, set from C: past it malloc, calloc, realloc and
 * posix_memalign fail with ENOMEM however often they are called. */
static void a_limit_refuses(void) {
  uint64_t before = usage(preload_group);
  OK(splitcount_group_set_max(preload_group, before + (1 << 20)));
  char *small = malloc(100000);
  CHECK(small != NULL);
  int refused = 0;
  for (int i = 0; i < 100; i++) {
    errno = 0;
    void *big = malloc(2 << 20);
    refused += big == NULL && errno == ENOMEM;
    free(big);
  }
  CHECK(refused == 100);
  errno = 0;
  CHECK(realloc(small, 4 << 20) == NULL && errno == ENOMEM);
  CHECK(calloc(1 << 10, 1 << 12) == NULL);
  void *al = NULL;
  CHECK(posix_memalign(&al, 64, 3 << 20) == ENOMEM && al == NULL);
  small[99999] = 1;
  free(small);
  OK(splitcount_group_set_max(preload_group, UINT64_MAX));
  CHECK(usage(preload_group) == before);
}

enum { THREADS = 4, BLOCKS = 5000 };
static void *handoff[THREADS][BLOCKS];
static pthread_barrier_t barrier;

static void *worker(void *arg) {
  int t = (int)(intptr_t)arg;
  for (int i = 0; i < BLOCKS; i++) handoff[t][i] = malloc(16 + (i * 37 + t) % 3000);
  pthread_barrier_wait(&barrier);
  /* Free the next thread's blocks. */
  int other = (t + 1) % THREADS;
  for (int i = 0; i < BLOCKS; i++) free(handoff[other][i]);
  return NULL;
}

static void run_threads(void) {
  pthread_t th[THREADS];
  pthread_barrier_init(&barrier, NULL, THREADS);
  for (int t = 0; t < THREADS; t++)
    CHECK(pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0);
  for (int t = 0; t < THREADS; t++) CHECK(pthread_join(th[t], NULL) == 0);
  pthread_barrier_destroy(&barrier);
}

/* Four threads allocate 5,000 blocks each and free their neighbour's.
 * glibc keeps what it made for the first threads (their stacks, cached
 * with their TLS blocks: about 300 bytes a thread), so the second round is
 * compared with the first: not a byte more. */
static void threads_and_cross_thread_frees(void) {
  uint64_t before = usage(preload_group);
  run_threads();
  uint64_t after_first = usage(preload_group);
  CHECK(after_first - before < 1024 * THREADS);
  run_threads();
  CHECK(usage(preload_group) == after_first);
}

static int fork_child(void) {
  void *p[100];
  for (int i = 0; i < 100; i++) p[i] = malloc(100 + i * 1000);
  for (int i = 0; i < 100; i++) p[i] = realloc(p[i], 50 + i * 2000);
  for (int i = 0; i < 100; i++) free(p[i]);
  return 0;
}

/* fork while three threads allocate and free: each child allocates and
 * frees on its own and exits 0; the parent's usage is back where it was
 * (the threads' blocks freed, their stacks cached as in a first round). */
static void fork_while_threads_allocate(void) {
  pthread_t th[3];
  start_churn(th);
  stop_churn(th);
  uint64_t before = usage(preload_group);
  start_churn(th);
  fork_children(40, fork_child);
  stop_churn(th);
  CHECK(usage(preload_group) == before);
}

static void entering_a_group_is_refused(void) {
  splitcount_group *g = child("tenant");
  CHECK(splitcount_enter(g) == SPLITCOUNT_E_STATE);
  CHECK(strstr(splitcount_last_error(), "SPLITCOUNT_PRELOAD_TAGS=off") != NULL);
  CHECK(splitcount_leave() == SPLITCOUNT_E_STATE);
  /* A program's own byte charges work as with tags. */
  OK(splitcount_group_try_charge(g, 1000));
  CHECK(usage(g) == 1000);
  OK(splitcount_group_uncharge(g, 1000));
  OK(splitcount_group_remove(g));
  /* /preload cannot go: every free uncharges it. */
  CHECK(splitcount_group_remove(preload_group) == SPLITCOUNT_E_STATE);
  CHECK(strstr(splitcount_last_error(), "cannot be removed") != NULL);
  uint64_t u = 0;
  OK(splitcount_group_usage(preload_group, &u));
}

int main(void) {
  /* stdout's buffer first: it is allocated at the first output. */
  printf("untagged_test: SPLITCOUNT_PRELOAD_TAGS=%s\n", getenv("SPLITCOUNT_PRELOAD_TAGS"));
  preload_handles();
  blocks_from_before_main_are_freed();
  usage_tracks_the_blocks_held();
  no_byte_per_block();
  realloc_is_charged_its_new_size();
  aligned_blocks_are_aligned_and_charged();
  small_blocks_at_16_are_16_aligned();
  a_limit_refuses();
  realloc_never_passes_the_limit();
  huge_sizes_are_refused_with_enomem();
  threads_and_cross_thread_frees();
  fork_while_threads_allocate();
  entering_a_group_is_refused();
  printf("untagged_test: %d checks passed\n", checks);
  return 0;
}
