/* A C program under the preload library (linked with it, so that it calls
 * the C API directly; LD_PRELOAD puts it first as well). Checks, in order:
 * blocks allocated before main, foreign blocks (glibc's, made without the
 * preload), accounting that tracks the blocks held exactly, refusal and
 * cooperative limits, realloc, aligned allocations, threads and
 * cross-thread frees, fork while other threads allocate. Prints
 * "heap_test: N checks passed" and exits 0. */
#define _GNU_SOURCE
#include "preload_test.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_memalign(size_t, size_t);

/* Allocated before main (by a constructor), freed in main. */
static void *early[64];

__attribute__((constructor)) static void before_main(void) {
  for (int i = 0; i < 64; i++) early[i] = malloc(32 + i * 100);
}

static void blocks_from_before_main_are_freed(void) {
  for (int i = 0; i < 64; i++) {
    CHECK(early[i] != NULL);
    CHECK(malloc_usable_size(early[i]) >= (size_t)(32 + i * 100));
    free(early[i]);
  }
}

static void foreign_blocks_go_to_glibc(void) {
  /* Blocks glibc made without the preload: freed, grown, measured. */
  for (int i = 0; i < 1000; i++) {
    char *p = __libc_malloc(16 + (i % 50) * 40);
    CHECK(p != NULL);
    memset(p, 0xA5, 16);
    CHECK(malloc_usable_size(p) >= (size_t)(16 + (i % 50) * 40));
    if (i % 3 == 0) {
      p = realloc(p, 5000);
      CHECK(p != NULL && (unsigned char)p[0] == 0xA5);
    }
    free(p);
  }
  void *a = __libc_memalign(256, 1000);
  CHECK(a != NULL);
  free(a);
}

static void usage_tracks_the_blocks_held(void) {
  splitcount_group *g = child("track");
  uint64_t before = usage(g);
  CHECK(before == 0);
  enum { N = 20000 };
  static void *p[N];
  size_t held = 0;
  struct mallinfo2 m0 = mallinfo2();
  OK(splitcount_enter(g));
  alloc_mixed_blocks(p, N);
  OK(splitcount_leave());
  for (int i = 0; i < N; i++) held += malloc_usable_size(p[i]);
  struct mallinfo2 m1 = mallinfo2();
  uint64_t tracked = usage(g);
  size_t glibc = (m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd);
  printf("tracked %llu bytes, held (malloc_usable_size) %zu bytes, glibc in use +%zu "
         "bytes for %d blocks\n",
         (unsigned long long)tracked, held, glibc, N);
  /* Exact: every byte of every block, nothing else (the stocks and this
   * thread's reserve were drained). */
  CHECK(tracked == held);
  /* glibc's chunks hold the header (16) and its own word (8) more (when
   * the blocks are glibc's: not with SPLITCOUNT_PRELOAD_INNER=jemalloc or
   * mimalloc). */
  const char *inner = getenv("SPLITCOUNT_PRELOAD_INNER");
  if (inner == NULL || inner[0] == '\0' || strcasecmp(inner, "glibc") == 0)
    CHECK(glibc >= held && glibc <= held + (size_t)N * 48 + 4096 * 40);
  for (int i = 0; i < N; i++) free(p[i]);
  CHECK(usage(g) == 0);
  OK(splitcount_group_remove(g));
}

/* Blocks allocated and freed while the group is entered take the fast
 * paths both ways: each free gives back exactly what its allocation
 * charged (on jemalloc and mimalloc, the size the allocation packed into
 * the header), so the usage is back at 0 with no underflow clamped on the
 * way. */
static void frees_in_the_group_give_back_what_was_charged(void) {
  splitcount_group *g = child("roundtrip");
  enum { N = 20000 };
  static void *p[N];
  OK(splitcount_enter(g));
  for (int round = 0; round < 3; round++) {
    alloc_mixed_blocks(p, N);
    for (int i = 0; i < N; i++) free(p[i]);
  }
  OK(splitcount_leave());
  CHECK(usage(g) == 0); /* drains the stocks and this thread's reserve */
  splitcount_events e;
  OK(splitcount_group_events(g, &e));
  CHECK(e.underflow == 0);
  OK(splitcount_group_remove(g));
}

/* A child of /preload with a limit of 1 MiB, entered. */
static splitcount_group *enter_limited(const char *name, uint32_t enforcement) {
  splitcount_group *g = child(name);
  OK(splitcount_group_set_max(g, 1 << 20));
  OK(splitcount_group_set_enforcement(g, enforcement));
  OK(splitcount_enter(g));
  return g;
}

static void refusal_returns_null_with_enomem(void) {
  splitcount_group *g = enter_limited("refuse", SPLITCOUNT_ENFORCE_REFUSE);
  char *small = malloc(100000);
  errno = 0;
  char *big = malloc(2 << 20);
  int err = errno;
  char *grown = realloc(small, 4 << 20);
  int err2 = errno;
  void *al = NULL;
  int rc = posix_memalign(&al, 64, 3 << 20);
  void *z = calloc(1 << 10, 1 << 12);
  OK(splitcount_leave());
  CHECK(small != NULL);
  CHECK(big == NULL && err == ENOMEM);
  CHECK(grown == NULL && err2 == ENOMEM); /* the old block is untouched */
  CHECK(rc == ENOMEM && al == NULL);
  CHECK(z == NULL);
  small[99999] = 1;
  splitcount_events ev;
  OK(splitcount_group_events(g, &ev));
  CHECK(ev.max >= 4);
  CHECK(usage(g) >= 100000 && usage(g) < 200000);
  free(small);
  CHECK(usage(g) == 0);
  OK(splitcount_group_remove(g));
}

/* The C API's one default: a tenant group made from C starts REFUSE, so a
 * max set on it limits malloc with no other call (10,000 × 1000 B under a
 * 1 MiB max: most are refused). */
static void a_max_set_from_c_limits_malloc_by_default(void) {
  splitcount_group *g = child("default-enforcement"), *root = NULL;
  uint32_t e = 9;
  OK(splitcount_group_enforcement(g, &e));
  CHECK(e == SPLITCOUNT_ENFORCE_REFUSE);
  OK(splitcount_hierarchy_root(h, &root));
  e = 9;
  OK(splitcount_group_enforcement(root, &e));
  CHECK(e == SPLITCOUNT_ENFORCE_REFUSE);
  OK(splitcount_group_release(root));
  OK(splitcount_group_set_max(g, 1 << 20));
  enum { N = 10000 };
  static void *p[N];
  int refused = 0;
  OK(splitcount_enter(g));
  for (int i = 0; i < N; i++) {
    p[i] = malloc(1000);
    refused += p[i] == NULL;
  }
  OK(splitcount_leave());
  CHECK(refused > N - 1100);
  CHECK(usage(g) <= 1 << 20);
  for (int i = 0; i < N; i++) free(p[i]);
  CHECK(usage(g) == 0);
  OK(splitcount_group_remove(g));
}

/* The preload's hierarchy is sized for bytes: a program's own byte
 * charges of typical sizes come from its CPU's stock (pinned, the usage
 * counter never moves after the first refill). */
static void byte_charges_from_c_hit_the_preload_stock(void) {
  cpu_set_t was, one;
  CHECK(sched_getaffinity(0, sizeof was, &was) == 0);
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  CHECK(sched_setaffinity(0, sizeof one, &one) == 0);
  splitcount_group *g = child("byte-charges");
  OK(splitcount_group_try_charge(g, 100)); /* a miss: refills the stock */
  uint64_t refilled = 0, v = 0;
  OK(splitcount_group_usage(g, &refilled));
  CHECK(refilled >= 100);
  uint64_t sizes[] = {100, 1000, 4096};
  for (int s = 0; s < 3; s++) {
    for (int i = 0; i < 1000; i++) {
      OK(splitcount_group_try_charge(g, sizes[s]));
      OK(splitcount_group_uncharge(g, sizes[s]));
      OK(splitcount_group_usage(g, &v));
      CHECK(v == refilled);
    }
  }
  OK(splitcount_group_uncharge(g, 100));
  CHECK(usage(g) == 0);
  OK(splitcount_group_remove(g));
  CHECK(sched_setaffinity(0, sizeof was, &was) == 0);
}

static void cooperative_limits_let_it_through_and_say_so(void) {
  splitcount_group *g = enter_limited("cooperative", SPLITCOUNT_ENFORCE_COOPERATIVE);
  char *big = malloc(3 << 20);
  OK(splitcount_leave());
  CHECK(big != NULL);
  CHECK(splitcount_group_check(g) == SPLITCOUNT_E_OVER_LIMIT);
  CHECK(strstr(splitcount_last_error(), "went over the limit of /preload/cooperative") != NULL);
  CHECK(usage(g) >= (3u << 20));
  free(big);
  OK(splitcount_group_clear_breach(g));
  OK(splitcount_group_check(g));
  OK(splitcount_group_remove(g));
}

static void realloc_and_aligned_blocks_are_charged_to_their_group(void) {
  splitcount_group *g = child("shapes");
  OK(splitcount_enter(g));
  char *p = malloc(100);
  strcpy(p, "kept");
  for (size_t n = 200; n < (8 << 20); n *= 3) {
    p = realloc(p, n);
    CHECK(p != NULL && strcmp(p, "kept") == 0);
  }
  p = realloc(p, 10);
  CHECK(p != NULL && memcmp(p, "kept", 5) == 0);
  void *al[4] = {0};
  CHECK(posix_memalign(&al[0], 64, 1000) == 0);
  al[1] = aligned_alloc(4096, 8192);
  al[2] = memalign(128, 300);
  al[3] = valloc(5000);
  CHECK(posix_memalign(&al[0], 3, 10) == EINVAL);
  OK(splitcount_leave());
  size_t expect = malloc_usable_size(p);
  size_t aligns[4] = {64, 4096, 128, 4096};
  for (int i = 0; i < 4; i++) {
    CHECK(al[i] != NULL && (uintptr_t)al[i] % aligns[i] == 0);
    expect += malloc_usable_size(al[i]);
  }
  CHECK(usage(g) == expect);
  size_t old = malloc_usable_size(al[2]);
  al[2] = realloc(al[2], 10000); /* an aligned block grows as a new block */
  CHECK(al[2] != NULL);
  CHECK(usage(g) == expect - old + malloc_usable_size(al[2]));
  for (int i = 0; i < 4; i++) free(al[i]);
  free(p);
  CHECK(usage(g) == 0);
  errno = 0;
  /* Sizes that overflow with the header, hidden from the compiler. */
  volatile size_t huge = SIZE_MAX - 8;
  CHECK(calloc(huge / 2, 4) == NULL && errno == ENOMEM);
  CHECK(malloc(huge) == NULL && errno == ENOMEM);
  OK(splitcount_group_remove(g));
}

/* Threads allocating in their own groups; every other block freed by the
 * next thread. */
enum { THREADS = 4, BLOCKS = 20000 };
static void *handoff[THREADS][BLOCKS];
static splitcount_group *thread_group[THREADS];
static pthread_barrier_t barrier;

static void *worker(void *arg) {
  int t = (int)(intptr_t)arg;
  if (splitcount_enter(thread_group[t]) != SPLITCOUNT_OK) return (void *)1;
  for (int i = 0; i < BLOCKS; i++) {
    void *p = malloc(16 + (i * 37) % 2000);
    if (i % 2)
      free(p);
    else
      handoff[t][i] = p;
  }
  splitcount_leave();
  pthread_barrier_wait(&barrier);
  for (int i = 0; i < BLOCKS; i += 2) free(handoff[(t + 1) % THREADS][i]);
  return NULL;
}

static void threads_and_cross_thread_frees(void) {
  char name[16];
  for (int t = 0; t < THREADS; t++) {
    snprintf(name, sizeof name, "thread-%d", t);
    thread_group[t] = child(name);
  }
  pthread_barrier_init(&barrier, NULL, THREADS);
  pthread_t th[THREADS];
  for (int t = 0; t < THREADS; t++)
    CHECK(pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0);
  for (int t = 0; t < THREADS; t++) {
    void *r;
    pthread_join(th[t], &r);
    CHECK(r == NULL);
  }
  /* The threads exited: their reserves came back. */
  for (int t = 0; t < THREADS; t++) {
    CHECK(usage(thread_group[t]) == 0);
    OK(splitcount_group_remove(thread_group[t]));
  }
}

/* A thread whose only call is a realloc that grows a block fills its
 * reserve on the growth's slow path: it must go back when the thread exits
 * (it stayed charged: 16 KiB more per such thread, until a limit refused a
 * program that held nothing). */
static void *grown;
static void *grow_only(void *arg) {
  (void)arg;
  void *q = realloc(grown, 200);
  CHECK(q != NULL);
  grown = q;
  return NULL;
}

static void threads_that_only_realloc_leave_nothing_charged(void) {
  uint64_t before = usage(preload_group);
  for (int i = 0; i < 50; i++) {
    grown = malloc(100);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, grow_only, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    free(grown);
  }
  /* The main thread's reserve may hold more (the freed blocks' bytes, up
   * to its 32 KiB cap); 50 threads' reserves would be 800 KiB. */
  CHECK(usage(preload_group) <= before + 32768);
}

/* /preload cannot go: threads outside any group charge it, and
 * SPLITCOUNT_PRELOAD_MAX is its limit (removed, its limit stopped holding
 * while the report still showed it). */
static void the_preload_group_cannot_be_removed(void) {
  CHECK(splitcount_group_remove(preload_group) == SPLITCOUNT_E_STATE);
  CHECK(strstr(splitcount_last_error(), "cannot be removed") != NULL);
  void *p = malloc(1000);
  CHECK(p != NULL);
  uint64_t u = 0;
  OK(splitcount_group_usage(preload_group, &u));
  CHECK(u >= 1000);
  free(p);
}

/* A group of a hierarchy the program made itself cannot be entered: its
 * scope took every malloc out of /preload, past SPLITCOUNT_PRELOAD_MAX and
 * out of the report. A group of the preload's hierarchy still can. */
static void groups_of_another_hierarchy_cannot_be_entered(void) {
  splitcount_hierarchy *own = NULL;
  splitcount_group *root = NULL;
  OK(splitcount_hierarchy_create_with(NULL, 0, SPLITCOUNT_STOCK_BATCH_BYTES,
                                      SPLITCOUNT_STOCK_SLOTS_MAX, &own));
  OK(splitcount_hierarchy_root(own, &root));
  CHECK(splitcount_enter(root) == SPLITCOUNT_E_STATE);
  CHECK(strstr(splitcount_last_error(), "another hierarchy") != NULL);
  CHECK(splitcount_leave() == SPLITCOUNT_E_STATE); /* nothing was entered */
  OK(splitcount_group_release(root));
  OK(splitcount_hierarchy_destroy(own));
  OK(splitcount_enter(preload_group));
  OK(splitcount_leave());
}

static int fork_child(void) {
  void *p[100];
  for (int i = 0; i < 100; i++) p[i] = malloc(100 + i * 1000);
  for (int i = 0; i < 100; i++) free(p[i]);
  splitcount_group *g = NULL;
  return splitcount_preload_group(&g) == SPLITCOUNT_OK ? 0 : 3;
}

static void fork_while_threads_allocate(void) {
  pthread_t th[3];
  start_churn(th);
  fork_children(40, fork_child);
  stop_churn(th);
}

int main(void) {
  preload_handles();
  blocks_from_before_main_are_freed();
  foreign_blocks_go_to_glibc();
  usage_tracks_the_blocks_held();
  frees_in_the_group_give_back_what_was_charged();
  refusal_returns_null_with_enomem();
  a_max_set_from_c_limits_malloc_by_default();
  byte_charges_from_c_hit_the_preload_stock();
  cooperative_limits_let_it_through_and_say_so();
  realloc_and_aligned_blocks_are_charged_to_their_group();
  threads_and_cross_thread_frees();
  threads_that_only_realloc_leave_nothing_charged();
  the_preload_group_cannot_be_removed();
  groups_of_another_hierarchy_cannot_be_entered();
  fork_while_threads_allocate();
  printf("heap_test: %d checks passed\n", checks);
  return 0;
}
