/* The C API from C: every group of calls, and the bad handles (NULL,
 * destroyed, released, removed, of another kind, made up) that must give
 * an error code and never a crash. Exits 0 and prints "api_test: N checks
 * passed" when every check holds. */
#define _GNU_SOURCE /* sched_getcpu, sched_setaffinity */
#include "check.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

static void counters(void) {
  splitcount_counter *c = NULL;
  OK(splitcount_counter_create(SPLITCOUNT_DESIGN_TREE, 0, &c));
  for (int i = 0; i < 1000; i++) OK(splitcount_counter_add(c, 3));
  OK(splitcount_counter_add(c, -1000));
  int64_t precise = 0, approx = 0;
  OK(splitcount_counter_precise(c, &precise));
  CHECK(precise == 2000);
  OK(splitcount_counter_approximate(c, &approx));
  uint64_t under = 1, over = 1;
  OK(splitcount_counter_accuracy(c, &under, &over));
  CHECK(over == 0);
  CHECK(approx <= precise && precise - approx <= (int64_t)under);
  int ord = 7;
  OK(splitcount_counter_compare(c, 2000, &ord));
  CHECK(ord == 0);
  OK(splitcount_counter_compare(c, 1 << 30, &ord));
  CHECK(ord == -1);
  OK(splitcount_counter_approximate_compare(c, -(1 << 30), &ord));
  CHECK(ord == 1);
  OK(splitcount_counter_set(c, 5));
  OK(splitcount_counter_precise(c, &precise));
  CHECK(precise == 5);

  /* Every design, and the batches they refuse. */
  for (uint32_t d = SPLITCOUNT_DESIGN_ATOMIC; d <= SPLITCOUNT_DESIGN_TREE; d++) {
    splitcount_counter *x = NULL;
    OK(splitcount_counter_create(d, 64, &x));
    OK(splitcount_counter_add(x, 1));
    OK(splitcount_counter_destroy(x));
  }
  splitcount_counter *bad = NULL;
  FAILS(splitcount_counter_create(SPLITCOUNT_DESIGN_TREE, 24, &bad),
        SPLITCOUNT_E_INVALID);
  CHECK(strstr(splitcount_last_error(), "power of two") != NULL);
  FAILS(splitcount_counter_create(99, 0, &bad), SPLITCOUNT_E_INVALID);
  FAILS(splitcount_counter_create(SPLITCOUNT_DESIGN_TREE, 0, NULL),
        SPLITCOUNT_E_NULL);
  FAILS(splitcount_counter_precise(c, NULL), SPLITCOUNT_E_NULL);

  /* Double destroy, use after destroy, NULL, made-up handles. */
  OK(splitcount_counter_destroy(c));
  FAILS(splitcount_counter_destroy(c), SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_counter_add(c, 1), SPLITCOUNT_E_HANDLE);
  CHECK(strstr(splitcount_last_error(), "splitcount_counter_add") != NULL);
  FAILS(splitcount_counter_add(NULL, 1), SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_counter_add((splitcount_counter *)(uintptr_t)0x1234, 1),
        SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_counter_add((splitcount_counter *)&checks, 1),
        SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_counter_add((splitcount_counter *)UINTPTR_MAX, 1),
        SPLITCOUNT_E_HANDLE);
  /* A stale handle whose slot now holds another counter. */
  splitcount_counter *again = NULL;
  OK(splitcount_counter_create(SPLITCOUNT_DESIGN_ATOMIC, 0, &again));
  /* (The slot index is a handle's low 24 bits.) */
  CHECK(((uintptr_t)again & 0xFFFFFF) == ((uintptr_t)c & 0xFFFFFF));
  FAILS(splitcount_counter_add(c, 1), SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_counter_destroy(c), SPLITCOUNT_E_HANDLE);
  OK(splitcount_counter_add(again, 1));
  OK(splitcount_counter_destroy(again));
}

struct adder {
  splitcount_counter *c;
  int rc;
};

static void *add_many(void *arg) {
  struct adder *a = arg;
  for (int i = 0; i < 100000; i++)
    if (splitcount_counter_add(a->c, 1) != SPLITCOUNT_OK) a->rc = 1;
  return NULL;
}

static void counter_threads(void) {
  splitcount_counter *c = NULL;
  OK(splitcount_counter_create(SPLITCOUNT_DESIGN_TREE, 0, &c));
  pthread_t t[4];
  struct adder a[4];
  for (int i = 0; i < 4; i++) {
    a[i].c = c;
    a[i].rc = 0;
    CHECK(pthread_create(&t[i], NULL, add_many, &a[i]) == 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    CHECK(a[i].rc == 0);
  }
  int64_t v = 0;
  OK(splitcount_counter_precise(c, &v));
  CHECK(v == 400000);
  OK(splitcount_counter_destroy(c));
}

static void groups(void) {
  splitcount_stat_item items[] = {{"anon", SPLITCOUNT_STAT_GAUGE},
                                  {"faults", SPLITCOUNT_STAT_EVENT}};
  splitcount_hierarchy *h = NULL;
  OK(splitcount_hierarchy_create(items, 2, &h));
  splitcount_group *root = NULL, *tenant = NULL, *query = NULL;
  OK(splitcount_hierarchy_root(h, &root));
  OK(splitcount_group_child(root, "tenant", &tenant));
  OK(splitcount_group_child(tenant, "query", &query));
  char path[64];
  size_t needed = 0;
  OK(splitcount_group_path(query, path, sizeof path, &needed));
  CHECK(strcmp(path, "/tenant/query") == 0 && needed == 14);
  FAILS(splitcount_group_path(query, path, 5, &needed), SPLITCOUNT_E_BUFFER);
  CHECK(needed == 14);
  splitcount_group *dup = NULL;
  FAILS(splitcount_group_child(tenant, "query", &dup), SPLITCOUNT_E_EXISTS);
  FAILS(splitcount_group_child(tenant, "a/b", &dup), SPLITCOUNT_E_INVALID);
  /* A newline would split a report's line (the preload's, memory.stat). */
  FAILS(splitcount_group_child(tenant, "a\nb", &dup), SPLITCOUNT_E_INVALID);
  CHECK(strstr(splitcount_last_error(), "control character") != NULL);
  FAILS(splitcount_group_child(tenant, "tab\there", &dup), SPLITCOUNT_E_INVALID);
  FAILS(splitcount_group_child(tenant, NULL, &dup), SPLITCOUNT_E_NULL);
  /* A failed call changes nothing: no out-pointer, no group made (it was
   * made without a handle, its name taken). */
  FAILS(splitcount_group_child(tenant, "unseen", NULL), SPLITCOUNT_E_NULL);
  OK(splitcount_group_child(tenant, "unseen", &dup));
  OK(splitcount_group_remove(dup));

  /* Limits, charges, refusals with the numbers. */
  OK(splitcount_group_set_max(tenant, 1000));
  uint64_t v = 0;
  OK(splitcount_group_max(tenant, &v));
  CHECK(v == 1000);
  OK(splitcount_group_try_charge(query, 600));
  FAILS(splitcount_group_try_charge(query, 600), SPLITCOUNT_E_LIMIT);
  CHECK(strstr(splitcount_last_error(),
               "refused by the limit of /tenant: limit 1000") != NULL);
  OK(splitcount_group_charge(query, 600)); /* forced: charged, and reported */
  OK(splitcount_group_usage(tenant, &v));
  CHECK(v == 1200);
  FAILS(splitcount_group_check(query), SPLITCOUNT_E_OVER_LIMIT);
  CHECK(strstr(splitcount_last_error(), "/tenant/query went over the limit of /tenant") != NULL);
  OK(splitcount_group_check(root)); /* above the limit's group: not breached */
  FAILS(splitcount_group_set_max(tenant, 100), SPLITCOUNT_E_BUSY);
  CHECK(strstr(splitcount_last_error(), "its usage is 1200") != NULL);
  OK(splitcount_group_uncharge(query, 1200));
  OK(splitcount_hierarchy_drain_stocks(h, NULL));
  OK(splitcount_group_usage(tenant, &v));
  CHECK(v == 0);
  OK(splitcount_group_peak(tenant, &v));
  CHECK(v == 1200);
  OK(splitcount_group_reset_peak(tenant));
  OK(splitcount_group_peak(tenant, &v));
  CHECK(v == 0);
  splitcount_events ev;
  OK(splitcount_group_events(tenant, &ev));
  CHECK(ev.max >= 1 && ev.oom >= 1 && ev.underflow == 0);
  OK(splitcount_group_set_high(tenant, 10));
  OK(splitcount_group_high(tenant, &v));
  CHECK(v == 10);
  OK(splitcount_group_set_max(tenant, SPLITCOUNT_UNLIMITED));
  /* One default for groups made through the C API: REFUSE (root too). */
  uint32_t enforcement = 9;
  OK(splitcount_group_enforcement(tenant, &enforcement));
  CHECK(enforcement == SPLITCOUNT_ENFORCE_REFUSE);
  OK(splitcount_group_enforcement(root, &enforcement));
  CHECK(enforcement == SPLITCOUNT_ENFORCE_REFUSE);
  OK(splitcount_group_set_enforcement(tenant, SPLITCOUNT_ENFORCE_COOPERATIVE));
  OK(splitcount_group_enforcement(tenant, &enforcement));
  CHECK(enforcement == SPLITCOUNT_ENFORCE_COOPERATIVE);
  OK(splitcount_group_set_enforcement(tenant, SPLITCOUNT_ENFORCE_REFUSE));
  FAILS(splitcount_group_set_enforcement(tenant, 5), SPLITCOUNT_E_INVALID);
  FAILS(splitcount_group_enforcement(tenant, NULL), SPLITCOUNT_E_NULL);
  OK(splitcount_group_set_ceiling(tenant, SPLITCOUNT_UNLIMITED));
  FAILS(splitcount_group_check(tenant), SPLITCOUNT_E_OVER_LIMIT); /* until cleared */
  OK(splitcount_group_clear_breach(tenant));
  OK(splitcount_group_check(tenant));
  OK(splitcount_group_clear_breach(query));

  /* Stat items. */
  uint32_t anon = 9, faults = 9, nope = 9;
  OK(splitcount_stat_id(h, "anon", &anon));
  OK(splitcount_stat_id(h, "faults", &faults));
  CHECK(anon == 0 && faults == 1);
  FAILS(splitcount_stat_id(h, "nope", &nope), SPLITCOUNT_E_NOT_FOUND);
  {
    /* A message repeats no more than a bounded part of a long input: a
     * 64 MiB path made a 64 MiB message. */
    size_t n = 1 << 20;
    char *huge = malloc(n + 1);
    CHECK(huge != NULL);
    memset(huge, 'x', n);
    huge[n] = '\0';
    FAILS(splitcount_stat_id(h, huge, &nope), SPLITCOUNT_E_NOT_FOUND);
    CHECK(strlen(splitcount_last_error()) < 400);
    splitcount_group *none = NULL;
    FAILS(splitcount_hierarchy_lookup(h, huge, &none), SPLITCOUNT_E_NOT_FOUND);
    CHECK(strlen(splitcount_last_error()) < 9000);
    CHECK(strstr(splitcount_last_error(), "1048576 bytes in all") != NULL);
    free(huge);
  }
  OK(splitcount_group_mod_stat(query, anon, 4096));
  OK(splitcount_group_mod_stat(query, faults, 1));
  FAILS(splitcount_group_mod_stat(query, faults, -1), SPLITCOUNT_E_INVALID);
  FAILS(splitcount_group_mod_stat(query, 7, 1), SPLITCOUNT_E_INVALID);
  bool flushed = false;
  OK(splitcount_group_flush(root, true, &flushed));
  int64_t s = 0;
  OK(splitcount_group_stat(root, anon, &s));
  CHECK(s == 4096);
  OK(splitcount_group_stat_local(root, anon, &s));
  CHECK(s == 0);

  /* Lookup, enter and leave. */
  splitcount_group *found = NULL;
  OK(splitcount_hierarchy_lookup(h, "tenant/query", &found));
  FAILS(splitcount_hierarchy_lookup(h, "tenant/none", &dup),
        SPLITCOUNT_E_NOT_FOUND);
  OK(splitcount_enter(found));
  OK(splitcount_enter(tenant));
  OK(splitcount_leave());
  OK(splitcount_leave());
  FAILS(splitcount_leave(), SPLITCOUNT_E_STATE);

  /* Removal: the root and a parent are refused; the removed handle is
   * released; another handle on the group refuses what would add to it
   * and still uncharges and reads. */
  FAILS(splitcount_group_remove(root), SPLITCOUNT_E_BUSY);
  FAILS(splitcount_group_remove(tenant), SPLITCOUNT_E_BUSY);
  OK(splitcount_group_try_charge(found, 10));
  OK(splitcount_group_remove(query));
  FAILS(splitcount_group_remove(query), SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_group_usage(query, &v), SPLITCOUNT_E_HANDLE);
  bool removed = false;
  OK(splitcount_group_is_removed(found, &removed));
  CHECK(removed);
  FAILS(splitcount_group_try_charge(found, 1), SPLITCOUNT_E_REMOVED);
  FAILS(splitcount_group_child(found, "x", &dup), SPLITCOUNT_E_REMOVED);
  FAILS(splitcount_enter(found), SPLITCOUNT_E_REMOVED);
  FAILS(splitcount_group_set_max(found, 1), SPLITCOUNT_E_REMOVED);
  OK(splitcount_group_uncharge(found, 10));
  OK(splitcount_group_usage(found, &v));
  OK(splitcount_group_release(found));
  FAILS(splitcount_group_release(found), SPLITCOUNT_E_HANDLE);

  /* A group handle is not a hierarchy or counter handle. */
  FAILS(splitcount_hierarchy_drain_stocks((splitcount_hierarchy *)tenant, NULL),
        SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_counter_add((splitcount_counter *)tenant, 1),
        SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_group_usage(NULL, &v), SPLITCOUNT_E_HANDLE);

  /* Destroying the hierarchy releases its group handles; twice is an
   * error. */
  OK(splitcount_hierarchy_destroy(h));
  FAILS(splitcount_group_usage(tenant, &v), SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_group_usage(root, &v), SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_hierarchy_destroy(h), SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_hierarchy_root(h, &dup), SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_hierarchy_create(NULL, 3, &h), SPLITCOUNT_E_NULL);
  splitcount_stat_item bad_items[] = {{"x", 7}};
  FAILS(splitcount_hierarchy_create(bad_items, 1, &h), SPLITCOUNT_E_INVALID);
}

/* Keep the calling thread on the CPU it runs on, so that its charges meet
 * one CPU's stock. */
static void stay_on_this_cpu(void) {
  int cpu = sched_getcpu();
  CHECK(cpu >= 0);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  CHECK(sched_setaffinity(0, sizeof set, &set) == 0);
}

/* usage counts what the stocks hold; usage_exact does not, and needs no
 * drain. */
static void exact_reads(void) {
  splitcount_hierarchy *h = NULL;
  splitcount_group *root = NULL, *tenant = NULL, *query = NULL;
  OK(splitcount_hierarchy_create(NULL, 0, &h));
  OK(splitcount_hierarchy_root(h, &root));
  OK(splitcount_group_child(root, "tenant", &tenant));
  OK(splitcount_group_child(tenant, "query", &query));
  uint64_t usage = 0, exact = 1, stocked = 0, below = 0;

  /* A symmetric charge and uncharge: usage keeps a batch per CPU that
   * charged, the exact read is 0. */
  OK(splitcount_group_try_charge(query, 10));
  OK(splitcount_group_uncharge(query, 10));
  OK(splitcount_group_usage(query, &usage));
  CHECK(usage > 0 && usage % SPLITCOUNT_STOCK_BATCH_DEFAULT == 0);
  OK(splitcount_group_usage_exact(query, &exact));
  CHECK(exact == 0);
  OK(splitcount_group_stocked(query, &stocked));
  CHECK(stocked == usage);

  /* Units in use below a group: its own stock holds none, its subtree's
   * does; the exact read of every level is what is in use. */
  OK(splitcount_group_try_charge(query, 10));
  OK(splitcount_group_try_charge(query, 7));
  OK(splitcount_group_uncharge(query, 7));
  OK(splitcount_group_usage(tenant, &usage));
  OK(splitcount_group_stocked(tenant, &stocked));
  OK(splitcount_group_stocked_subtree(tenant, &below));
  CHECK(stocked == 0 && below == usage - 10);
  OK(splitcount_group_usage_exact(tenant, &exact));
  CHECK(exact == 10);
  OK(splitcount_group_usage_exact(root, &exact));
  CHECK(exact == 10);
  /* The drain-and-read gives the same number, and leaves usage exact. */
  OK(splitcount_hierarchy_drain_stocks(h, NULL));
  OK(splitcount_group_usage(tenant, &usage));
  CHECK(usage == 10);
  OK(splitcount_group_usage_exact(tenant, &exact));
  CHECK(exact == 10);
  FAILS(splitcount_group_usage_exact(tenant, NULL), SPLITCOUNT_E_NULL);
  FAILS(splitcount_group_usage_exact(NULL, &exact), SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_group_stocked(NULL, &stocked), SPLITCOUNT_E_HANDLE);
  OK(splitcount_hierarchy_destroy(h));
}

/* A forced charge (never refused) past max is reported, as the preload's
 * malloc over a cooperative limit is: a max event, a breach once per
 * episode, check says so until cleared — under either enforcement. Within
 * the limit nothing is reported. */
static void forced_charges(void) {
  splitcount_hierarchy *h = NULL;
  splitcount_group *root = NULL, *g = NULL;
  OK(splitcount_hierarchy_create(NULL, 0, &h));
  OK(splitcount_hierarchy_root(h, &root));
  OK(splitcount_group_child(root, "forced", &g));
  OK(splitcount_group_set_max(g, 1000));
  uint32_t modes[] = {SPLITCOUNT_ENFORCE_COOPERATIVE, SPLITCOUNT_ENFORCE_REFUSE};
  for (int i = 0; i < 2; i++) {
    OK(splitcount_group_set_enforcement(g, modes[i]));
    splitcount_events before, after;
    OK(splitcount_group_events(g, &before));
    OK(splitcount_group_charge(g, 500)); /* within: nothing to report */
    OK(splitcount_group_check(g));
    OK(splitcount_group_charge(g, 1000)); /* past max: charged, reported */
    uint64_t exact = 0;
    OK(splitcount_group_usage_exact(g, &exact));
    CHECK(exact == 1500);
    FAILS(splitcount_group_check(g), SPLITCOUNT_E_OVER_LIMIT);
    CHECK(strstr(splitcount_last_error(), "/forced") != NULL);
    OK(splitcount_group_check(root)); /* above the limit's group */
    OK(splitcount_group_charge(g, 10)); /* the same episode */
    OK(splitcount_group_events(g, &after));
    CHECK(after.max == before.max + 2 && after.breaches == before.breaches + 1);
    CHECK(after.oom == before.oom);
    /* The limit's verdict is try_charge's: refused either way. */
    FAILS(splitcount_group_try_charge(g, 1), SPLITCOUNT_E_LIMIT);
    OK(splitcount_group_events(g, &after));
    CHECK(after.refused >= before.refused + 1);
    OK(splitcount_group_clear_breach(g));
    OK(splitcount_group_check(g));
    OK(splitcount_group_uncharge(g, 1510));
    /* (Units the uncharge stocked would serve the next round's try_charge.) */
    OK(splitcount_hierarchy_drain_stocks(h, NULL));
  }
  FAILS(splitcount_group_charge(g, (uint64_t)1 << 60), SPLITCOUNT_E_INVALID);
  OK(splitcount_hierarchy_destroy(h));
}

/* An uncharge through another handle of a removed group comes off what
 * the group still holds, clamped there: an excess is its underflow, never
 * a sibling's units (it used to reach the root whole, and the sibling
 * could then charge past the root's limit). */
static void removed_group_uncharge(void) {
  splitcount_hierarchy *h = NULL;
  splitcount_group *root = NULL, *a = NULL, *b = NULL, *stale = NULL;
  OK(splitcount_hierarchy_create(NULL, 0, &h));
  OK(splitcount_hierarchy_root(h, &root));
  OK(splitcount_group_set_max(root, 150));
  OK(splitcount_group_child(root, "a", &a));
  OK(splitcount_group_child(root, "b", &b));
  OK(splitcount_group_charge(a, 100));
  OK(splitcount_group_charge(b, 20));
  OK(splitcount_hierarchy_lookup(h, "b", &stale));
  OK(splitcount_group_remove(b));
  OK(splitcount_group_uncharge(stale, 40));
  OK(splitcount_hierarchy_drain_stocks(h, NULL));
  uint64_t ua = 0, ub = 0, ur = 0;
  OK(splitcount_group_usage_exact(a, &ua));
  OK(splitcount_group_usage_exact(stale, &ub));
  OK(splitcount_group_usage_exact(root, &ur));
  CHECK(ua == 100 && ub == 0 && ur == 100);
  splitcount_events ev;
  OK(splitcount_group_events(stale, &ev));
  CHECK(ev.underflow == 1);
  FAILS(splitcount_group_try_charge(a, 70), SPLITCOUNT_E_LIMIT);
  OK(splitcount_group_try_charge(a, 50));
  /* A request too large to be anything but a bug is invalid, as for
   * splitcount_group_charge, and no refusal. */
  OK(splitcount_group_events(a, &ev));
  uint64_t refused = ev.refused;
  FAILS(splitcount_group_try_charge(a, (uint64_t)1 << 60), SPLITCOUNT_E_INVALID);
  OK(splitcount_group_events(a, &ev));
  CHECK(ev.refused == refused);
  /* A NULL buffer is said to be one. */
  size_t need = 0;
  FAILS(splitcount_group_path(a, NULL, 100, &need), SPLITCOUNT_E_BUFFER);
  CHECK(need == 3 && strstr(splitcount_last_error(), "NULL") != NULL);
  OK(splitcount_group_release(stale));
  OK(splitcount_hierarchy_destroy(h));
}

/* Byte charges (100 B to 4 KiB) meet the stock under a 64 KiB batch; they
 * all miss it under the default batch of 64 units. */
static void byte_stock(void) {
  splitcount_hierarchy *h = NULL;
  FAILS(splitcount_hierarchy_create_with(NULL, 0, 0, 7, &h),
        SPLITCOUNT_E_INVALID);
  CHECK(strstr(splitcount_last_error(), "stock batch") != NULL);
  FAILS(splitcount_hierarchy_create_with(NULL, 0, SPLITCOUNT_STOCK_BATCH_MAX + 1,
                                         7, &h),
        SPLITCOUNT_E_INVALID);
  FAILS(splitcount_hierarchy_create_with(NULL, 0, UINT64_MAX, 7, &h),
        SPLITCOUNT_E_INVALID);
  FAILS(splitcount_hierarchy_create_with(NULL, 0, 65536, 0, &h),
        SPLITCOUNT_E_INVALID);
  FAILS(splitcount_hierarchy_create_with(NULL, 0, 65536,
                                         SPLITCOUNT_STOCK_SLOTS_MAX + 1, &h),
        SPLITCOUNT_E_INVALID);
  FAILS(splitcount_hierarchy_create_with(NULL, 0, 65536, 7, NULL),
        SPLITCOUNT_E_NULL);
  OK(splitcount_hierarchy_create_with(NULL, 0, SPLITCOUNT_STOCK_BATCH_MAX, 1, &h));
  OK(splitcount_hierarchy_destroy(h));

  stay_on_this_cpu();
  const uint64_t sizes[] = {100, 1000, 4096};
  const uint64_t batch = SPLITCOUNT_STOCK_BATCH_BYTES;
  splitcount_hierarchy *bytes = NULL, *units = NULL;
  splitcount_group *broot = NULL, *b = NULL, *uroot = NULL, *u = NULL;
  OK(splitcount_hierarchy_create_with(NULL, 0, batch,
                                      SPLITCOUNT_STOCK_SLOTS_MAX, &bytes));
  OK(splitcount_hierarchy_root(bytes, &broot));
  OK(splitcount_group_child(broot, "bytes", &b));
  OK(splitcount_hierarchy_create(NULL, 0, &units));
  OK(splitcount_hierarchy_root(units, &uroot));
  OK(splitcount_group_child(uroot, "bytes", &u));
  uint64_t usage = 0, stocked = 0;

  /* The first charge misses: a whole batch is charged, the rest stocked. */
  OK(splitcount_group_try_charge(b, sizes[0]));
  OK(splitcount_group_usage(b, &usage));
  OK(splitcount_group_stocked(b, &stocked));
  CHECK(usage == batch && stocked == batch - sizes[0]);
  OK(splitcount_group_uncharge(b, sizes[0]));
  /* Then every size, charged and uncharged 1000 times, is a stock hit:
   * the usage never moves. */
  for (int round = 0; round < 1000; round++) {
    for (int i = 0; i < 3; i++) {
      OK(splitcount_group_try_charge(b, sizes[i]));
      OK(splitcount_group_usage(b, &usage));
      CHECK(usage == batch);
      OK(splitcount_group_uncharge(b, sizes[i]));
    }
  }
  OK(splitcount_group_stocked(b, &stocked));
  CHECK(stocked == batch);
  OK(splitcount_group_usage_exact(b, &usage));
  CHECK(usage == 0);

  /* Under the default batch each of them misses, every time: it is
   * charged to the usage counters exactly, and the stock keeps at most a
   * batch of 64 units of what the uncharges give back. */
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 3; i++) {
      uint64_t was = 0;
      OK(splitcount_group_usage(u, &was));
      OK(splitcount_group_try_charge(u, sizes[i]));
      OK(splitcount_group_usage(u, &usage));
      CHECK(usage == was + sizes[i]);
      OK(splitcount_group_uncharge(u, sizes[i]));
      OK(splitcount_group_stocked(u, &stocked));
      CHECK(stocked <= SPLITCOUNT_STOCK_BATCH_DEFAULT);
    }
  }
  /* The unchecked path charges the same way: every size a stock hit. */
  splitcount_group_fast bf;
  OK(splitcount_group_fast_get(b, &bf));
  for (int round = 0; round < 1000; round++) {
    for (int i = 0; i < 3; i++) {
      OK(splitcount_group_fast_try_charge(&bf, sizes[i]));
      OK(splitcount_group_usage(b, &usage));
      CHECK(usage == batch);
      splitcount_group_fast_uncharge(&bf, sizes[i]);
    }
  }
  OK(splitcount_group_usage_exact(b, &usage));
  CHECK(usage == 0);
  OK(splitcount_hierarchy_destroy(bytes));
  OK(splitcount_hierarchy_destroy(units));
}

/* The unchecked group path: the limit's verdict and message, a removed
 * group refused, bad handles refused when the path is taken. */
static void fast_group_path(void) {
  splitcount_hierarchy *h = NULL;
  splitcount_group *root = NULL, *g = NULL, *again = NULL;
  splitcount_group_fast f;
  OK(splitcount_hierarchy_create(NULL, 0, &h));
  OK(splitcount_hierarchy_root(h, &root));
  OK(splitcount_group_child(root, "fast", &g));
  OK(splitcount_group_set_max(g, 1000));
  OK(splitcount_group_fast_get(g, &f));
  OK(splitcount_group_fast_try_charge(&f, 600));
  FAILS(splitcount_group_fast_try_charge(&f, 600), SPLITCOUNT_E_LIMIT);
  CHECK(strstr(splitcount_last_error(), "limit 1000") != NULL);
  splitcount_group_fast_uncharge(&f, 600);
  uint64_t usage = 1;
  OK(splitcount_group_usage_exact(g, &usage));
  CHECK(usage == 0);
  /* Removed through another handle: the path (still valid: its handle
   * lives) refuses new charges, as the handle API does. */
  OK(splitcount_hierarchy_lookup(h, "/fast", &again));
  OK(splitcount_group_remove(again));
  FAILS(splitcount_group_fast_try_charge(&f, 1), SPLITCOUNT_E_REMOVED);
  CHECK(strstr(splitcount_last_error(), "removed") != NULL);
  FAILS(splitcount_group_fast_get(NULL, &f), SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_group_fast_get(g, NULL), SPLITCOUNT_E_REMOVED);
  OK(splitcount_hierarchy_destroy(h));
  FAILS(splitcount_group_fast_get(g, &f), SPLITCOUNT_E_HANDLE);
}

/* Callbacks: events and pressure, with re-entrant calls into the API. */
struct seen {
  int kinds[5];
  uint64_t last_usage, last_limit, last_seq, pressure_over;
  char path[64];
  splitcount_group *other; /* charged from inside the callback */
  int pressure_calls;
};

static void on_event(const splitcount_event *e, void *data) {
  struct seen *s = data;
  if (e->kind < 5) s->kinds[e->kind]++;
  s->last_usage = e->usage;
  s->last_limit = e->limit;
  CHECK(e->seq > s->last_seq || s->last_seq == 0);
  s->last_seq = e->seq;
  snprintf(s->path, sizeof s->path, "%s", e->path);
  /* Re-entrant: charge another group, read this one. */
  OK(splitcount_group_try_charge(s->other, 1));
  uint64_t v;
  CHECK(splitcount_group_usage(s->other, &v) == SPLITCOUNT_OK && v >= 1);
}

static void on_pressure(const char *path, uint64_t over, void *data) {
  struct seen *s = data;
  s->pressure_calls++;
  s->pressure_over = over;
  CHECK(strcmp(path, "/watched") == 0);
}

static void callbacks(void) {
  splitcount_hierarchy *h = NULL;
  splitcount_group *root = NULL, *g = NULL, *other = NULL;
  OK(splitcount_hierarchy_create(NULL, 0, &h));
  OK(splitcount_hierarchy_root(h, &root));
  OK(splitcount_group_child(root, "watched", &g));
  OK(splitcount_group_child(root, "other", &other));
  static struct seen s;
  memset(&s, 0, sizeof s);
  s.other = other;
  FAILS(splitcount_group_on_event(g, NULL, &s), SPLITCOUNT_E_NULL);
  FAILS(splitcount_group_on_event(NULL, on_event, &s), SPLITCOUNT_E_HANDLE);
  FAILS(splitcount_group_on_pressure(g, NULL, &s), SPLITCOUNT_E_NULL);
  OK(splitcount_group_on_event(g, on_event, &s));
  OK(splitcount_group_on_pressure(g, on_pressure, &s));
  OK(splitcount_group_set_high(g, 1000));
  OK(splitcount_group_set_max(g, 2000));

  /* Above high: one crossing (charges beyond the stock's batch go to the
   * counters exactly). */
  OK(splitcount_group_try_charge(g, 1500));
  CHECK(s.kinds[SPLITCOUNT_EVENT_HIGH_CROSSED] == 1);
  CHECK(s.last_limit == 1000 && s.last_usage >= 1500);
  CHECK(strcmp(s.path, "/watched") == 0);
  CHECK(s.pressure_calls == 1 && s.pressure_over >= 500);
  OK(splitcount_group_try_charge(g, 100));
  CHECK(s.kinds[SPLITCOUNT_EVENT_HIGH_CROSSED] == 1); /* still above: no new one */
  /* Refused at max: one event for the episode. */
  FAILS(splitcount_group_try_charge(g, 5000), SPLITCOUNT_E_LIMIT);
  FAILS(splitcount_group_try_charge(g, 5000), SPLITCOUNT_E_LIMIT);
  CHECK(s.kinds[SPLITCOUNT_EVENT_MAX_REFUSED] == 1);
  CHECK(s.last_limit == 2000);
  /* Back under high. */
  OK(splitcount_group_uncharge(g, 1600));
  OK(splitcount_hierarchy_drain_stocks(h, NULL));
  CHECK(s.kinds[SPLITCOUNT_EVENT_BACK_UNDER_HIGH] == 1);
  CHECK(s.last_limit == 1000);
  /* The callback's own charges (one per event) reached the other group. */
  uint64_t v = 0;
  OK(splitcount_hierarchy_drain_stocks(h, NULL));
  OK(splitcount_group_usage(other, &v));
  int events = 0;
  for (int k = 0; k < 5; k++) events += s.kinds[k];
  CHECK(v == (uint64_t)events);
  OK(splitcount_hierarchy_destroy(h));
}

/* The header's version macros are the library's version. */
static void version(void) {
  char built[64];
  snprintf(built, sizeof built, "%d.%d.%d", SPLITCOUNT_VERSION_MAJOR,
           SPLITCOUNT_VERSION_MINOR, SPLITCOUNT_VERSION_PATCH);
  const char *v = splitcount_version();
  CHECK(v != NULL);
  CHECK(strncmp(v, built, strlen(built)) == 0);
  char next = v[strlen(built)];
  CHECK(next == '\0' || next == '-' || next == '+');
}

static void errors(void) {
  CHECK(strcmp(splitcount_status_name(SPLITCOUNT_E_HANDLE),
               "SPLITCOUNT_E_HANDLE") == 0);
  CHECK(strcmp(splitcount_status_name(12345), "unknown") == 0);
  splitcount_hierarchy *h = NULL;
  /* Without the preload library its hierarchy is not there. */
  FAILS(splitcount_preload_hierarchy(&h), SPLITCOUNT_E_STATE);
  CHECK(strstr(splitcount_last_error(), "LD_PRELOAD") != NULL);
}

int main(void) {
  counters();
  counter_threads();
  groups();
  exact_reads();
  fast_group_path();
  callbacks();
  forced_charges();
  removed_group_uncharge();
  byte_stock();
  version();
  errors();
  printf("api_test: %d checks passed\n", checks);
  return 0;
}
