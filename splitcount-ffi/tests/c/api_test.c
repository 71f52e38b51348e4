/* The C API from C: every group of calls, and the bad handles (NULL,
 * destroyed, released, removed, of another kind, made up) that must give
 * an error code and never a crash. Exits 0 and prints "api_test: N checks
 * passed" when every check holds. */
#include "check.h"

#include <pthread.h>
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
  CHECK(((uintptr_t)again & 0xFFFFFFFF) == ((uintptr_t)c & 0xFFFFFFFF));
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
  FAILS(splitcount_group_child(tenant, NULL, &dup), SPLITCOUNT_E_NULL);

  /* Limits, charges, refusals with the numbers. */
  OK(splitcount_group_set_max(tenant, 1000));
  uint64_t v = 0;
  OK(splitcount_group_max(tenant, &v));
  CHECK(v == 1000);
  OK(splitcount_group_try_charge(query, 600));
  FAILS(splitcount_group_try_charge(query, 600), SPLITCOUNT_E_LIMIT);
  CHECK(strstr(splitcount_last_error(),
               "refused by the limit of /tenant: limit 1000") != NULL);
  OK(splitcount_group_charge(query, 600)); /* forced */
  OK(splitcount_group_usage(tenant, &v));
  CHECK(v == 1200);
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
  OK(splitcount_group_set_enforcement(tenant, SPLITCOUNT_ENFORCE_REFUSE));
  FAILS(splitcount_group_set_enforcement(tenant, 5), SPLITCOUNT_E_INVALID);
  OK(splitcount_group_set_ceiling(tenant, SPLITCOUNT_UNLIMITED));
  OK(splitcount_group_check(tenant));
  OK(splitcount_group_clear_breach(tenant));

  /* Stat items. */
  uint32_t anon = 9, faults = 9, nope = 9;
  OK(splitcount_stat_id(h, "anon", &anon));
  OK(splitcount_stat_id(h, "faults", &faults));
  CHECK(anon == 0 && faults == 1);
  FAILS(splitcount_stat_id(h, "nope", &nope), SPLITCOUNT_E_NOT_FOUND);
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
  errors();
  printf("api_test: %d checks passed\n", checks);
  return 0;
}
