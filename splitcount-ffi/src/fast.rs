//! The fast paths for C, whose lifetime is the caller's contract (as for a
//! `FILE*`) instead of a checked handle's:
//!
//! - **A counter's add.** `splitcount_counter_fast_get` fills a
//!   `splitcount_counter_fast` once; the header's `static inline`
//!   `splitcount_counter_fast_add` then adds with no call and no check —
//!   on a tree counter whose adds are rseq sequences on glibc's areas, the
//!   same critical section the Rust add runs, written in the header (see
//!   `IMPLEMENTATION.md`, §10, "The fast path"). Everything else (another
//!   design, a machine where the tree's adds are atomic, a thread without
//!   rseq, a carry to the levels above) takes one call into the functions
//!   below, which skip the handle table as well.
//! - **A group's charge.** `splitcount_group_fast_get` fills a
//!   `splitcount_group_fast`; `splitcount_group_fast_try_charge` and
//!   `_uncharge` are the handle API's charge and uncharge without the
//!   lookup (the charge itself, through the per-CPU stock, stays in Rust:
//!   the stock's layout is not part of the ABI).
//!
//! A counter's struct is valid until `splitcount_counter_destroy`; a
//! group's while the handle it came from is live. Using either afterwards
//! is undefined behaviour. Programs that want every use checked keep
//! calling the handle API.

use crate::counter::{counter_entry, Counter};
use crate::error::{put, run, Error, SPLITCOUNT_E_INVALID, SPLITCOUNT_E_REMOVED, SPLITCOUNT_OK};
use crate::group::GroupEntry;
use crate::{splitcount_counter, splitcount_group};
use splitcount::counter::SplitCounter;
use std::ffi::{c_int, c_void};

/// What `splitcount_counter_fast_add` needs, filled by
/// `splitcount_counter_fast_get`. Plain data: copy it freely; it stays
/// valid until the counter is destroyed.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct splitcount_counter_fast {
    /// CPU 0's copy of a tree counter's slot (CPU `c`'s is `c · 4096`
    /// bytes on); NULL when adds cannot be inlined here (then every add
    /// calls `splitcount_counter_fast_add_call`).
    pub slot0: *mut i64,
    /// The CPUs with a copy: a CPU id at or above it is never written.
    pub regions: u64,
    /// glibc's `__rseq_offset`: the calling thread's rseq area is at
    /// `%fs:rseq_offset`.
    pub rseq_offset: isize,
    /// The slot's batch (a power of two): an add that moves the slot
    /// across a multiple of it calls `splitcount_counter_fast_carry`.
    pub batch: u64,
    /// The counter (opaque; for the calls).
    pub counter: *const c_void,
}

/// Fill `*out` with the fast path of a live counter (any design). The
/// struct is valid until `splitcount_counter_destroy(counter)`; using it
/// after that is undefined behaviour (unlike the handle, it is not
/// checked).
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_counter_fast_get(
    counter: *mut splitcount_counter,
    out: *mut splitcount_counter_fast,
) -> c_int {
    run("splitcount_counter_fast_get", || {
        let c = counter_entry(counter)?;
        let inline = match c {
            Counter::Tree(t) => t.inline_add(),
            _ => None,
        };
        let fast = splitcount_counter_fast {
            slot0: inline.map_or(std::ptr::null_mut(), |i| i.slot0),
            regions: inline.map_or(0, |i| i.regions as u64),
            rseq_offset: inline.map_or(0, |i| i.rseq_offset),
            batch: inline.map_or(0, |i| i.batch),
            counter: c as *const Counter as *const c_void,
        };
        if !fast.slot0.is_null() && !fast.batch.is_power_of_two() {
            // Not reached: a tree's batch is a power of two.
            return Err(Error::new(SPLITCOUNT_E_INVALID, "batch not a power of two"));
        }
        // SAFETY: the caller's contract.
        unsafe { put(out, fast) }
    })
}

/// The counter of a fast path.
///
/// # Safety
/// `fast` was filled by `splitcount_counter_fast_get` for a counter not
/// destroyed since.
unsafe fn counter_of<'a>(fast: *const splitcount_counter_fast) -> &'a Counter {
    // SAFETY: the caller's contract: `counter` points into the registry's
    // slot of a live counter, which does not move while it lives.
    unsafe { &*((*fast).counter as *const Counter) }
}

/// The whole add, out of line: what `splitcount_counter_fast_add` calls
/// when it cannot add inline (no rseq here, a design other than the
/// tree, the thread's CPU beyond the counter's). Never checks the counter.
///
/// Thread-safe.
///
/// # Safety
/// `fast` was filled by `splitcount_counter_fast_get` and its counter not
/// destroyed since.
#[no_mangle]
pub unsafe extern "C" fn splitcount_counter_fast_add_call(
    fast: *const splitcount_counter_fast,
    delta: i64,
) {
    // SAFETY: the caller's contract.
    match unsafe { counter_of(fast) } {
        Counter::Tree(t) => t.add(delta),
        other => other.add(delta),
    }
}

/// The rest of an inline add that moved CPU `cpu`'s slot to `value` by
/// `delta` across a multiple of the batch: the carry to the levels above
/// (one add in `batch` on average). Never checks the counter.
///
/// Thread-safe.
///
/// # Safety
/// As `splitcount_counter_fast_add_call`; `cpu`, `value` and `delta` are
/// those of the inline sequence that just committed.
#[no_mangle]
pub unsafe extern "C" fn splitcount_counter_fast_carry(
    fast: *const splitcount_counter_fast,
    cpu: u64,
    value: i64,
    delta: i64,
) {
    // SAFETY: the caller's contract.
    if let Counter::Tree(t) = unsafe { counter_of(fast) } {
        t.after_inline_add(cpu as usize, value, delta);
    }
}

/// A group's charge path for C without the handle check: filled by
/// `splitcount_group_fast_get`, valid while the handle it came from is
/// (until `splitcount_group_release` or `_remove` of that handle, or the
/// destruction of its hierarchy) — not checked.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct splitcount_group_fast {
    /// The group (opaque).
    pub group: *const c_void,
}

/// Fill `*out` with the unchecked charge path of a live group handle.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_fast_get(
    group: *mut splitcount_group,
    out: *mut splitcount_group_fast,
) -> c_int {
    run("splitcount_group_fast_get", || {
        let entry = crate::group::live(group)?;
        let fast = splitcount_group_fast {
            group: entry as *const GroupEntry as *const c_void,
        };
        // SAFETY: the caller's contract.
        unsafe { put(out, fast) }
    })
}

/// The group of a fast path.
///
/// # Safety
/// `fast` was filled by `splitcount_group_fast_get` from a handle still
/// live.
unsafe fn group_of<'a>(fast: *const splitcount_group_fast) -> &'a GroupEntry {
    // SAFETY: the caller's contract: `group` points into the registry's
    // slot of a live handle, which does not move while it lives.
    unsafe { &*((*fast).group as *const GroupEntry) }
}

/// `splitcount_group_try_charge` without the handle check: the same
/// charge (this CPU's stock, then the usage counters, refused after
/// reclaim and draining with `SPLITCOUNT_E_LIMIT` and the message), and
/// `SPLITCOUNT_E_REMOVED` for a removed group.
///
/// Thread-safe.
///
/// # Safety
/// `fast` was filled by `splitcount_group_fast_get` from a handle still
/// live.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_fast_try_charge(
    fast: *const splitcount_group_fast,
    n: u64,
) -> c_int {
    // SAFETY: the caller's contract.
    let entry = unsafe { group_of(fast) };
    if entry.group.is_removed() {
        return refused(entry, None);
    }
    match entry.group.charge(n) {
        Ok(()) => SPLITCOUNT_OK,
        Err(e) => refused(entry, Some(e)),
    }
}

/// The error of a fast charge: the status, and the message for
/// `splitcount_last_error`.
#[cold]
#[inline(never)]
fn refused(entry: &GroupEntry, e: Option<splitcount::ChargeError>) -> c_int {
    run("splitcount_group_fast_try_charge", || {
        Err(match e {
            Some(e) => crate::group::charge_error(e),
            None => Error::new(
                SPLITCOUNT_E_REMOVED,
                format!("group {} was removed", entry.group.path()),
            ),
        })
    })
}

/// `splitcount_group_uncharge` without the handle check.
///
/// Thread-safe.
///
/// # Safety
/// As `splitcount_group_fast_try_charge`.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_fast_uncharge(
    fast: *const splitcount_group_fast,
    n: u64,
) {
    // SAFETY: the caller's contract.
    unsafe { group_of(fast) }.group.uncharge(n);
}
