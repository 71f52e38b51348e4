//! Split counters: create with a design and a batch, add, approximate and
//! precise reads, the accuracy bounds, exact and approximate comparisons,
//! set.
//!
//! A counter is a [`splitcount::counter`] design held by value in its slot
//! (an enum, not a trait object): an add through a handle is a slot lookup
//! and the design's own add.

use crate::error::{put, run, run_infallible, Error, Result, SPLITCOUNT_E_INVALID};
use crate::handle::{id, Registry};
use crate::splitcount_counter;
use splitcount::counter::{
    ApproxOrdering, Atomic, Batched, Config, Design, PerNode, SplitCounter, Tree,
};
use std::cmp::Ordering;
use std::ffi::c_int;

/// One shared atomic: exact, the baseline that collapses under contention.
pub const SPLITCOUNT_DESIGN_ATOMIC: u32 = 0;
/// The kernel's `percpu_counter`: per-CPU values and a total.
pub const SPLITCOUNT_DESIGN_BATCHED: u32 = 1;
/// One atomic per NUMA node and a global.
pub const SPLITCOUNT_DESIGN_PERNODE: u32 = 2;
/// The hierarchical split counter (the default design).
pub const SPLITCOUNT_DESIGN_TREE: u32 = 3;

/// `splitcount_counter_approximate_compare`: the approximate value cannot
/// tell; only a precise sum can.
pub const SPLITCOUNT_UNKNOWN: c_int = 2;

pub(crate) enum Counter {
    Atomic(Atomic),
    Batched(Batched),
    PerNode(PerNode),
    Tree(Tree),
}

impl Counter {
    #[inline]
    fn get(&self) -> &dyn SplitCounter {
        match self {
            Counter::Atomic(c) => c,
            Counter::Batched(c) => c,
            Counter::PerNode(c) => c,
            Counter::Tree(c) => c,
        }
    }

    /// The hot path: the tree's add inlined, the other designs' called (so
    /// that their code does not widen the tree's stack frame).
    #[inline(always)]
    pub(crate) fn add(&self, delta: i64) {
        match self {
            Counter::Tree(c) => c.add(delta),
            other => other.add_other(delta),
        }
    }

    #[inline(never)]
    fn add_other(&self, delta: i64) {
        self.get().add(delta)
    }
}

pub(crate) static COUNTERS: Registry<Counter> = Registry::new(3, "counter");

fn counter(c: *mut splitcount_counter) -> Result<&'static Counter> {
    COUNTERS.get(id(c))
}

/// A live counter by its handle (for the fast path's set-up).
pub(crate) fn counter_entry(c: *mut splitcount_counter) -> Result<&'static Counter> {
    counter(c)
}

/// Read a value of a counter into `*out`.
///
/// # Safety
/// `out` is null or valid for a write.
unsafe fn read(
    function: &str,
    c: *mut splitcount_counter,
    out: *mut i64,
    f: impl FnOnce(&dyn SplitCounter) -> i64,
) -> c_int {
    // SAFETY: the caller's contract.
    run(function, || unsafe { put(out, f(counter(c)?.get())) })
}

fn invalid(e: impl std::fmt::Display) -> Error {
    Error::new(SPLITCOUNT_E_INVALID, e.to_string())
}

fn ordering(o: Ordering) -> c_int {
    o as c_int
}

/// Create a counter of `design` (`SPLITCOUNT_DESIGN_*`) on this machine
/// with `batch` (0: the design's default — 32 for the tree, `max(32,
/// 2·ncpu)` for batched); its handle in `*out`. A batch the design refuses
/// (the tree's must be a power of two ≥ 2) is `SPLITCOUNT_E_INVALID` with
/// the reason.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_counter_create(
    design: u32,
    batch: u64,
    out: *mut *mut splitcount_counter,
) -> c_int {
    run("splitcount_counter_create", || {
        let d = match design {
            SPLITCOUNT_DESIGN_ATOMIC => Design::Atomic,
            SPLITCOUNT_DESIGN_BATCHED => Design::Batched,
            SPLITCOUNT_DESIGN_PERNODE => Design::PerNode,
            SPLITCOUNT_DESIGN_TREE => Design::Tree,
            other => {
                return Err(invalid(format!(
                    "design {other}: SPLITCOUNT_DESIGN_ATOMIC (0), _BATCHED (1), \
                     _PERNODE (2) or _TREE (3)"
                )))
            }
        };
        let mut config = Config::new(d);
        if batch != 0 {
            config = config.batch(batch);
        }
        let c = match d {
            Design::Atomic => Counter::Atomic(Atomic::with_config(&config).map_err(invalid)?),
            Design::Batched => Counter::Batched(Batched::with_config(&config).map_err(invalid)?),
            Design::PerNode => Counter::PerNode(PerNode::with_config(&config).map_err(invalid)?),
            _ => Counter::Tree(Tree::with_config(&config).map_err(invalid)?),
        };
        // SAFETY: the caller's contract.
        unsafe { COUNTERS.hand_out(c, out) }
    })
}

/// Destroy a counter. A second destroy is `SPLITCOUNT_E_HANDLE`.
///
/// Must not run concurrently with other calls using this counter.
#[no_mangle]
pub extern "C" fn splitcount_counter_destroy(counter: *mut splitcount_counter) -> c_int {
    run("splitcount_counter_destroy", || {
        COUNTERS.remove(id(counter)).map(drop)
    })
}

/// Add `delta` (either sign) on the current CPU: the hot path. Values wrap
/// on overflow, like the kernel's.
///
/// Thread-safe; touches only this CPU's part (and a carry now and then).
#[no_mangle]
pub extern "C" fn splitcount_counter_add(counter: *mut splitcount_counter, delta: i64) -> c_int {
    // The hot path: a live tree, its add inlined; everything else (other
    // designs, a bad handle and its error) out of line, so that this frame
    // saves no registers it does not use.
    if let Some(Counter::Tree(t)) = COUNTERS.find(id(counter)) {
        return run_infallible(ADD, || t.add(delta));
    }
    add_slow(counter, delta)
}

const ADD: &str = "splitcount_counter_add";

/// [`splitcount_counter_add`] for the designs other than the tree, and
/// the error of a bad handle.
#[cold]
#[inline(never)]
fn add_slow(counter: *mut splitcount_counter, delta: i64) -> c_int {
    match COUNTERS.find(id(counter)) {
        Some(c) => run_infallible(ADD, || c.add(delta)),
        None => run(ADD, || self::counter(counter).map(drop)),
    }
}

/// The cheap value in `*out`: O(1), within the accuracy bounds of the
/// precise value when no add is in flight.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_counter_approximate(
    counter: *mut splitcount_counter,
    out: *mut i64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        read("splitcount_counter_approximate", counter, out, |c| {
            c.approximate()
        })
    }
}

/// The exact value in `*out`: sums every CPU's part (O(CPUs)); every add
/// that returned before the call is counted.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_counter_precise(
    counter: *mut splitcount_counter,
    out: *mut i64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { read("splitcount_counter_precise", counter, out, |c| c.precise()) }
}

/// The accuracy bounds: with no add in flight, `precise − *under ≤
/// approximate ≤ precise + *over`. The tree never over-reports (`*over` is
/// 0).
///
/// Thread-safe.
///
/// # Safety
/// `under` and `over` are valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_counter_accuracy(
    counter: *mut splitcount_counter,
    under: *mut u64,
    over: *mut u64,
) -> c_int {
    run("splitcount_counter_accuracy", || {
        let (u, o) = self::counter(counter)?.get().accuracy().bounds();
        // SAFETY: the caller's contract.
        unsafe {
            put(under, u)?;
            put(over, o)
        }
    })
}

/// Exact three-way comparison of the precise value with `v`: `*out` is -1
/// (less), 0 or 1 (greater). Sums the CPUs only when `v` lies inside the
/// accuracy band of the approximate value.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_counter_compare(
    counter: *mut splitcount_counter,
    v: i64,
    out: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    run("splitcount_counter_compare", || unsafe {
        put(out, ordering(self::counter(counter)?.get().compare(v)))
    })
}

/// Comparison with `v` from the approximate value alone: `*out` is -1, 0,
/// 1, or `SPLITCOUNT_UNKNOWN` when `v` lies inside the accuracy band.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_counter_approximate_compare(
    counter: *mut splitcount_counter,
    v: i64,
    out: *mut c_int,
) -> c_int {
    run("splitcount_counter_approximate_compare", || {
        let o = match self::counter(counter)?.get().approximate_compare(v) {
            ApproxOrdering::Less => -1,
            ApproxOrdering::Equal => 0,
            ApproxOrdering::Greater => 1,
            ApproxOrdering::Unknown => SPLITCOUNT_UNKNOWN,
        };
        // SAFETY: the caller's contract.
        unsafe { put(out, o) }
    })
}

/// Reset the value to `v` through a bias: adds racing with it are never
/// lost. Calls of `set` itself are not serialized: reset from one thread
/// at a time.
///
/// Thread-safe with respect to adds and reads.
#[no_mangle]
pub extern "C" fn splitcount_counter_set(counter: *mut splitcount_counter, v: i64) -> c_int {
    run("splitcount_counter_set", || {
        self::counter(counter)?.get().set(v);
        Ok(())
    })
}
