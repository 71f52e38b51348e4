/* A block glibc made without the preload, laid by glibc over the header of
 * a block the preload has given back, is not taken for one of the
 * preload's: `malloc_usable_size`, `realloc` and `free` treat it as
 * glibc's, and the group that the old block was charged to stays exact.
 * Two ways to give a block back, one per mode (the argument):
 *
 *   free      the program frees it (`Block::free` clears the tag);
 *   realloc   the program grows it and glibc moves it (`Block::realloc`
 *             clears the tag before glibc may move the block).
 *
 * Why it could be: the preload finds its blocks by the tag 16 bytes before
 * the user pointer p (at glibc's block base = p - 16, where glibc keeps a
 * free chunk's forward pointer). A chunk that glibc merges with the one
 * before it, or into the top chunk, keeps its bytes, so if a later chunk
 * starts 16 bytes after the old one, its user pointer is p again and its
 * `prev_size` word (which glibc leaves alone while the chunk before is in
 * use) is the old tag. Only the cleared tag stands between that word and
 * `find`.
 *
 * The layouts, with S larger than every free chunk outside the top chunk
 * (from mallinfo2), so that glibc carves each block from the top chunk, in
 * order, and no other free chunk fits where the test needs one (x86_64 and
 * aarch64 glibc: 8-byte size word, 16-byte alignment):
 *
 *   x            c = x + S
 *   | P: S, glibc's | A: S + 32, the preload's: tag at c+16, user pointer c+32
 *
 *   free:    A freed (merges into the top chunk), then P (merges too).
 *   realloc: G: S, glibc's, after A (so that A cannot grow in place); P
 *            freed (binned: A is in use), then A grown through the preload:
 *            glibc moves it (A2, after G) and frees A's old chunk, which
 *            merges with P's, A's tag word inside:
 *            | free: 2S + 32 at x       | G | A2 | top
 *
 *   then, either way: P2 splits what is free at x, and Q (glibc's, S)
 *   takes the rest (realloc: an exact fit; free: the top chunk):
 *   | P2: S + 16, the preload's | Q: glibc's: user pointer c+32, A's
 *                               ^ c+16: Q's prev_size, A's tag word
 *
 * Run with GLIBC_TUNABLES=glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0
 * :glibc.malloc.mmap_threshold=16777216 (tests/preload.rs sets it). The
 * test's blocks are larger than any tcache or fastbin chunk; the tunables
 * are for the small chunks around them (the program's, stdio's, the
 * preload's own): without tcache and fastbins each merges with its free
 * neighbours when freed, so mallinfo2's free bytes are the chunks malloc
 * may choose from, and no fastbin chunk is consolidated into the top
 * chunk by a large malloc between the steps (which would move the top
 * chunk). The mmap threshold keeps S, however large, in the heap.
 *
 * A third mode, `trailer`, is the same for an over-aligned block, whose
 * tag is in a trailer at the end of its usable bytes (`Block::free` clears
 * it too): the preload's `memalign(64, S)` is glibc's `memalign(64, S +
 * 16)`, freed, and glibc's own `__libc_memalign(64, S + 16)` gets the same
 * chunk back, the old trailer's tag word where the preload would look.
 *
 * Exits 0 after "stale_tag_test: N checks passed"; 1 when a check fails;
 * 2, with the addresses, when glibc did not lay the blocks out as above
 * (then the test would check nothing, and says so instead of passing). */
#define _GNU_SOURCE
#include "preload_test.h"

#include <malloc.h>
#include <stdint.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

/* The layout is not as drawn: say what was found, exit 2. */
#define ARRANGED(cond, ...)                                                    \
  do {                                                                         \
    checks++;                                                                  \
    if (!(cond)) {                                                             \
      fprintf(stderr, "stale_tag_test: not arranged: %s: ", #cond);            \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\nstale_tag_test: glibc did not lay a foreign block "   \
                      "over the header of a block the preload gave back; "     \
                      "the test checks nothing on this glibc and fails "       \
                      "instead\n");                                            \
      exit(2);                                                                 \
    }                                                                          \
  } while (0)

/* The word where the preload looks for the tag of the block at p. */
static uint64_t tag_word(void *p) { return ((uint64_t *)p)[-2]; }

/* glibc's usable size of an in-use arena chunk's block, from its size
 * word: what malloc_usable_size must say of a block that is not ours. */
static size_t glibc_usable(void *p) { return (((size_t *)p)[-1] & ~(size_t)7) - 8; }

/* The `trailer` mode: an over-aligned block's trailer, left behind, would
 * be found at the end of a foreign block laid at the same address with the
 * same size. */
static void trailer(splitcount_group *g, size_t S) {
  char *A = memalign(64, S);                  /* glibc's memalign(64, S + 16) */
  uintptr_t a = (uintptr_t)A;
  ARRANGED(A != NULL, "memalign(64, %zu) failed", S);
  size_t old = malloc_usable_size(A);
  CHECK(usage(g) == old);
  free(A);
  CHECK(usage(g) == 0);
  char *Q = __libc_memalign(64, S + 16);
  ARRANGED((uintptr_t)Q == a, "S=%zu A=%#lx Q=%p", S, a, (void *)Q);
  ARRANGED(glibc_usable(Q) == old + 16, "Q's usable size %zu, A's %zu + 16", glibc_usable(Q),
           old);
  size_t usable = malloc_usable_size(Q);
  if (usable != glibc_usable(Q))
    fprintf(stderr, "malloc_usable_size(Q) = %zu, glibc's %zu\n", usable, glibc_usable(Q));
  CHECK(usable == glibc_usable(Q));
  free(Q);
  CHECK(usage(g) == 0);
  printf("trailer: foreign block %#lx laid over the old block's trailer\n", a);
}

int main(int argc, char **argv) {
  int by_realloc = argc == 2 && strcmp(argv[1], "realloc") == 0;
  int by_trailer = argc == 2 && strcmp(argv[1], "trailer") == 0;
  if (argc != 2 || (!by_realloc && !by_trailer && strcmp(argv[1], "free") != 0)) {
    fprintf(stderr, "usage: stale_tag_test free|realloc|trailer\n");
    return 1;
  }
  preload_handles();
  splitcount_group *g = child("stale-tag");
  OK(splitcount_enter(g));

  /* What the charge path sets up on first use (the thread's reserve, the
   * group's stock) is set up now, not between the blocks below. */
  for (int i = 0; i < 4; i++) free(realloc(malloc(4096 << i), 8192 << i));

  struct mallinfo2 m = mallinfo2();
  size_t binned = m.fordblks - m.keepcost; /* free, not in the top chunk */
  size_t S = ((binned + 15) & ~(size_t)15) + 4096;
  if (by_trailer) {
    trailer(g, S);
    OK(splitcount_leave());
    splitcount_events ev;
    OK(splitcount_group_events(g, &ev));
    CHECK(ev.underflow == 0);
    OK(splitcount_group_remove(g));
    printf("stale_tag_test: %d checks passed\n", checks);
    return 0;
  }

  char *P = __libc_malloc(S - 8);             /* chunk S at x = P - 16 */
  char *A = malloc(S);                        /* chunk S + 32 at c = x + S */
  uintptr_t p = (uintptr_t)P, a = (uintptr_t)A; /* compared after A goes */
  ARRANGED(P != NULL && a == p + S + 16, "S=%zu P=%#lx A=%#lx", S, p, a);
  uint64_t tag = tag_word(A);
  ARRANGED(tag != 0, "A's tag word is 0");
  CHECK(usage(g) == malloc_usable_size(A));

  /* A goes back to glibc; in the realloc mode, A2 is what it became. */
  char *G = NULL, *A2 = NULL;
  if (by_realloc) {
    G = __libc_malloc(S - 8);                 /* chunk S at c + S + 32 */
    uintptr_t guard = (uintptr_t)G;
    ARRANGED(guard == a + S + 16, "S=%zu A=%#lx G=%#lx", S, a, guard);
    __libc_free(P);
    A2 = realloc(A, 2 * S);                   /* the preload's realloc */
    ARRANGED(A2 != NULL && (uintptr_t)A2 > guard, "S=%zu A=%#lx G=%#lx A2=%p", S, a,
             guard, (void *)A2);
  } else {
    free(A);                                  /* the preload's free */
    __libc_free(P);
  }
  size_t kept = A2 != NULL ? malloc_usable_size(A2) : 0;
  CHECK(usage(g) == kept);

  char *P2 = malloc(S - 8);                   /* chunk S + 16 at x */
  char *Q = __libc_malloc(S);                 /* chunk at c + 16 */
  ARRANGED((uintptr_t)P2 == p + 16, "S=%zu P=%#lx P2=%p", S, p, (void *)P2);
  ARRANGED((uintptr_t)Q == a, "S=%zu A=%#lx Q=%p", S, a, (void *)Q);
  /* glibc left A's tag word alone: it is as the preload left it (cleared)
   * or, were it not cleared, A's tag. Anything else: not the case to test. */
  uint64_t left = tag_word(Q);
  ARRANGED(left == 0 || left == tag, "Q's tag word %#llx (A's tag was %#llx)",
           (unsigned long long)left, (unsigned long long)tag);
  /* The program uses its block: all of P2 but its last word, which is Q's
   * prev_size, the word under test. P2's bytes cover A's old size word (at
   * c+8), which a block taken for ours by mistake would read as its size
   * (left as it was, it gives glibc's usable size of Q, by coincidence:
   * A's chunk was 16 bytes longer, and the header is 16 bytes). */
  memset(P2, 0x5A, S - 16);
  size_t charged = kept + malloc_usable_size(P2);
  CHECK(usage(g) == charged);

  /* The foreign block, through the preload's entry points: glibc's. */
  size_t usable = malloc_usable_size(Q);
  if (usable != glibc_usable(Q))
    fprintf(stderr, "malloc_usable_size(Q) = %zu, glibc's %zu\n", usable, glibc_usable(Q));
  CHECK(usable == glibc_usable(Q));
  memset(Q, 0x5A, S);
  char *Q2 = realloc(Q, 2 * S);
  CHECK(Q2 != NULL && (unsigned char)Q2[0] == 0x5A && (unsigned char)Q2[S - 1] == 0x5A);
  CHECK(malloc_usable_size(Q2) == glibc_usable(Q2));
  free(Q2);
  CHECK(usage(g) == charged);

  free(P2);
  free(A2);
  __libc_free(G);
  OK(splitcount_leave());
  CHECK(usage(g) == 0);
  splitcount_events ev;
  OK(splitcount_group_events(g, &ev));
  CHECK(ev.underflow == 0);
  OK(splitcount_group_remove(g));
  /* Printed last: stdout's buffer is a block of the preload's too. */
  printf("%s: foreign block %#lx laid over the old block's header (its tag word %s)\n",
         argv[1], a, left == tag ? "still the old block's tag" : "cleared");
  printf("stale_tag_test: %d checks passed\n", checks);
  return 0;
}
