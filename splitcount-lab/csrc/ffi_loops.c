/* `bench ffi`'s loops in C: each runs `n` operations, as a C program's
 * loop would, so that what is measured is the C side's own code (the
 * header's inline add, a call into the library) and not a Rust-to-C call
 * per operation. Compiled by build.rs (with -O2) and linked into the lab. */
#include "splitcount.h"

#include <stdatomic.h>

/* splitcount_counter_fast_add(f, 1), inline (the header's sequence). */
void lab_c_counter_add_inline(const splitcount_counter_fast *f, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) splitcount_counter_fast_add(f, 1);
}

/* splitcount_counter_add(c, 1): the checked handle, a call per add. */
void lab_c_counter_add_checked(splitcount_counter *c, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) (void)splitcount_counter_add(c, 1);
}

/* One shared atomic, relaxed: what a C program would write first. */
void lab_c_atomic_add(_Atomic int64_t *a, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) atomic_fetch_add_explicit(a, 1, memory_order_relaxed);
}

/* A thread-local add that stays a load, an add and a store per operation
 * (volatile: not folded into one add): the floor of any per-thread or
 * per-CPU add. */
static _Thread_local volatile int64_t tls_count;
void lab_c_tls_add(uint64_t n) {
  for (uint64_t i = 0; i < n; i++) tls_count = tls_count + 1;
}

/* try_charge(bytes) + uncharge(bytes) through the unchecked group path. */
void lab_c_charge_fast(const splitcount_group_fast *g, uint64_t bytes, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    if (splitcount_group_fast_try_charge(g, bytes) == SPLITCOUNT_OK)
      splitcount_group_fast_uncharge(g, bytes);
  }
}

/* The same through the checked handles. */
void lab_c_charge_checked(splitcount_group *g, uint64_t bytes, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    if (splitcount_group_try_charge(g, bytes) == SPLITCOUNT_OK)
      (void)splitcount_group_uncharge(g, bytes);
  }
}
