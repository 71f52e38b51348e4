/* The counters' fast path from C (splitcount_counter_fast_add: an rseq
 * sequence inline in the caller, or a call). Stress: 8 threads add
 * deltas that cross the batch (so carries run) to one tree counter, while
 * a migrator thread moves each of them between the CPUs with
 * sched_setaffinity on its tid, a signaller interrupts them (a signal
 * restarts a sequence), and one thread adds through the checked handle
 * (the Rust add's sequence on the same slots). After the joins the
 * precise value is exactly the sum of what was added, and the approximate
 * value is within the counter's bounds. The same for an atomic counter
 * (every add a call). Built twice by tests/c_api.rs: as is, and with
 * -DSPLITCOUNT_NO_INLINE_RSEQ (every add through the call). Prints
 * "fast_add_test: inline|call, N checks passed". */
#define _GNU_SOURCE
#include "check.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { WORKERS = 8, ADDS = 1000000 };

static splitcount_counter *counter;
static splitcount_counter_fast fast;
static atomic_int stop;
static atomic_int tids[WORKERS];
static int64_t sums[WORKERS + 1];

static void on_signal(int sig) { (void)sig; }

/* xorshift: a delta in [-3·batch, 3·batch], 0 and ±1 often. */
static int64_t next_delta(uint64_t *s, int64_t batch) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  switch (*s % 4) {
    case 0: return 1;
    case 1: return -1;
    default: return (int64_t)(*s >> 8) % (3 * batch + 1) - (int64_t)((*s >> 4) % 2) * 3 * batch / 2;
  }
}

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  atomic_store(&tids[id], (int)syscall(SYS_gettid));
  uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1);
  int64_t sum = 0;
  for (int i = 0; i < ADDS; i++) {
    int64_t d = next_delta(&s, 64);
    splitcount_counter_fast_add(&fast, d);
    sum += d;
  }
  sums[id] = sum;
  atomic_store(&tids[id], 0);
  return NULL;
}

static void *checked_adder(void *arg) {
  (void)arg;
  uint64_t s = 42;
  int64_t sum = 0;
  for (int i = 0; i < ADDS; i++) {
    int64_t d = next_delta(&s, 64);
    /* (not OK(): `checks` is not atomic) */
    if (splitcount_counter_add(counter, d) != SPLITCOUNT_OK) {
      fprintf(stderr, "splitcount_counter_add: %s\n", splitcount_last_error());
      exit(1);
    }
    sum += d;
  }
  sums[WORKERS] = sum;
  return NULL;
}

static void *migrator(void *arg) {
  (void)arg;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned n = 0;
  while (!atomic_load(&stop)) {
    for (int w = 0; w < WORKERS; w++) {
      int tid = atomic_load(&tids[w]);
      if (tid == 0) continue;
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET((int)(n++ % (unsigned)cpus), &set);
      sched_setaffinity(tid, sizeof set, &set); /* may fail: the thread left */
      /* By tid (a thread that left gives ESRCH; pthread_kill on a joined
       * thread would be undefined). */
      if (n % 7 == 0) syscall(SYS_tgkill, getpid(), tid, SIGUSR1);
    }
    usleep(200);
  }
  return NULL;
}

static void stress(uint32_t design) {
  OK(splitcount_counter_create(design, 0, &counter));
  OK(splitcount_counter_fast_get(counter, &fast));
  pthread_t workers[WORKERS], extra, mover;
  atomic_store(&stop, 0);
  memset(tids, 0, sizeof tids);
  for (int w = 0; w < WORKERS; w++)
    CHECK(pthread_create(&workers[w], NULL, worker, (void *)(intptr_t)w) == 0);
  CHECK(pthread_create(&extra, NULL, checked_adder, NULL) == 0);
  CHECK(pthread_create(&mover, NULL, migrator, NULL) == 0);
  for (int w = 0; w < WORKERS; w++) CHECK(pthread_join(workers[w], NULL) == 0);
  CHECK(pthread_join(extra, NULL) == 0);
  atomic_store(&stop, 1);
  CHECK(pthread_join(mover, NULL) == 0);
  int64_t expected = 0;
  for (int i = 0; i <= WORKERS; i++) expected += sums[i];
  int64_t precise = 0, approximate = 0;
  uint64_t under = 0, over = 0;
  OK(splitcount_counter_precise(counter, &precise));
  OK(splitcount_counter_approximate(counter, &approximate));
  OK(splitcount_counter_accuracy(counter, &under, &over));
  if (precise != expected)
    fprintf(stderr, "design %u: precise %lld, added %lld\n", design, (long long)precise,
            (long long)expected);
  CHECK(precise == expected);
  CHECK(approximate >= precise - (int64_t)under && approximate <= precise + (int64_t)over);
  OK(splitcount_counter_destroy(counter));
}

int main(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);

  /* A tree: inline where the host's rseq allows (unless compiled out). */
  OK(splitcount_counter_create(SPLITCOUNT_DESIGN_TREE, 64, &counter));
  OK(splitcount_counter_fast_get(counter, &fast));
  int inline_add = fast.slot0 != NULL;
#ifdef SPLITCOUNT_NO_INLINE_RSEQ
  inline_add = 0;
#endif
  if (fast.slot0 != NULL) {
    CHECK(fast.batch == 64 && fast.regions >= 1 && fast.counter != NULL);
  }
  /* The carry: 64 ones reach the root's approximate value on one CPU. */
  for (int i = 0; i < 1000; i++) splitcount_counter_fast_add(&fast, 1);
  int64_t v = 0;
  OK(splitcount_counter_precise(counter, &v));
  CHECK(v == 1000);
  OK(splitcount_counter_approximate(counter, &v));
  CHECK(v >= 1000 - 64 * 64 && v <= 1000);
  OK(splitcount_counter_destroy(counter));
  FAILS(splitcount_counter_fast_get(counter, &fast), SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_counter_fast_get(NULL, &fast), SPLITCOUNT_E_HANDLE);

  stress(SPLITCOUNT_DESIGN_TREE);
  stress(SPLITCOUNT_DESIGN_ATOMIC);
  stress(SPLITCOUNT_DESIGN_BATCHED);

  printf("fast_add_test: %s, %d checks passed\n", inline_add ? "inline" : "call", checks);
  return 0;
}
