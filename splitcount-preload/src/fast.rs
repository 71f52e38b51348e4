//! `malloc` and `free` in their common case, in one straight line.
//!
//! Once the accounting is ready, most calls find everything settled: the
//! mode (tags or not), the heap, the charging (usable sizes), and the
//! thread's reserve holding bytes of the account it charges. The exported
//! `malloc` and `free` jump through one function pointer each, [`MALLOC`]
//! and [`FREE`]: the general path's until the set-up ends, then the
//! function written for the settled heap and mode, which does only what
//! the block needs:
//!
//! ```text
//!  malloc(size)                              free(p)
//!  ───────────                               ───────
//!  jump through MALLOC                       jump through FREE (p not null)
//!  base = heap.malloc(size [+ 16])           [tagged] tag check → account
//!  n = heap.usable(base) [− 16]              [untagged] not a set-up block
//!  reserve: take n bytes (thread-local)      n = heap.usable(base) [− 16]
//!  [tagged] write tag and account            reserve: give n bytes back
//!  return                                    [tagged] clear the tag
//!                                            tail call heap.free(base)
//! ```
//!
//! Anything else — a reserve that misses, a NULL from the heap, a block
//! with a trailer or not ours, a block made during the set-up — goes to
//! the general path with nothing changed by the fast one (a block already
//! made is handed to the general path's `finish`, which charges it as it
//! would have). What is charged and when is the general path's, to the
//! byte: the fast path is the general path's common case written out
//! without its dispatch (mode, state, heap and charging loads, the
//! fallback scope's check, the miss branches inline).
//!
//! Not fast: `SPLITCOUNT_PRELOAD_CHARGE=footprint` (its sizes take a
//! look at the heap's own sizes), and everything before the set-up ended.

use crate::header::{self, Block, HEADER};
use crate::heap::{FreeFn, Heap, MallocFn};
use crate::{untagged, ACCOUNTED};
use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};

/// Where `malloc` jumps: [`crate::malloc_general`] until the set-up has
/// ended with the accounting ready and usable-size charging, then the
/// fast function of the heap and mode. Holds only [`MallocFn`]s.
static MALLOC: AtomicPtr<()> = AtomicPtr::new(crate::malloc_general as MallocFn as *mut ());

/// Where `free` jumps for a block that is not null: as [`MALLOC`], from
/// [`crate::free_general`]. Holds only [`FreeFn`]s.
static FREE: AtomicPtr<()> = AtomicPtr::new(crate::free_general as FreeFn as *mut ());

/// Turn the fast path on, for blocks of `heap` with or without tags. Call
/// once, after the accounting is marked ready.
pub(crate) fn enable(heap: Heap, untagged: bool) {
    // The fast paths read the cookie without making it (no call): made
    // here, before the pointers' Release.
    header::make_cookie();
    let (malloc, free): (MallocFn, FreeFn) = match (heap == Heap::Inner, untagged) {
        (false, false) => (malloc_tagged::<false>, free_tagged::<false>),
        (true, false) => (malloc_tagged::<true>, free_tagged::<true>),
        (false, true) => (malloc_untagged::<false>, free_untagged::<false>),
        (true, true) => (malloc_untagged::<true>, free_untagged::<true>),
    };
    // Release: a thread that jumps to a fast function sees the set-up's
    // writes (the attached allocator, `/preload`'s account), as after
    // READY.
    FREE.store(free as *mut (), Ordering::Release);
    MALLOC.store(malloc as *mut (), Ordering::Release);
}

/// The function `malloc` jumps to now.
#[inline(always)]
pub(crate) fn malloc_fn() -> MallocFn {
    // Acquire: pairs with `enable` (a plain load on x86).
    let f = MALLOC.load(Ordering::Acquire);
    // SAFETY: `MALLOC` holds only `MallocFn`s (its initial value and
    // `enable`'s), never null.
    unsafe { std::mem::transmute::<*mut (), MallocFn>(f) }
}

/// The function `free` jumps to now, for a block that is not null.
#[inline(always)]
pub(crate) fn free_fn() -> FreeFn {
    // Acquire: as in `malloc_fn`.
    let f = FREE.load(Ordering::Acquire);
    // SAFETY: `FREE` holds only `FreeFn`s, never null.
    unsafe { std::mem::transmute::<*mut (), FreeFn>(f) }
}

/// The heap of the fast path's functions for `INNER`.
#[inline(always)]
const fn heap<const INNER: bool>() -> Heap {
    if INNER {
        Heap::Inner
    } else {
        Heap::Glibc
    }
}

// Each combination of heap and tags is a function of its own, reached by
// the exported function's jump through `MALLOC` or `FREE`: `malloc` and
// `free` themselves save no registers, and each function saves only what
// its own path needs (without calls, glibc without tags saves none at
// `free`), with the heap a constant in it. They are `extern "C"`: a
// function that cannot unwind needs no landing pad in the caller
// (`malloc` may not unwind either), so every call that ends a path is a
// jump.

/// # Safety
/// As `malloc(3)`.
#[inline(never)]
unsafe extern "C" fn malloc_untagged<const INNER: bool>(size: usize) -> *mut c_void {
    let heap = heap::<INNER>();
    if size > isize::MAX as usize {
        return crate::enomem();
    }
    // SAFETY: the heap's allocator.
    let p = unsafe { heap.malloc(size) };
    if !p.is_null() {
        // SAFETY: a live block the heap just made for `size` bytes.
        let n = unsafe { heap.usable_of_new(p, size) };
        // SAFETY: the set-up claimed static TLS before turning this on;
        // `/preload` is not a root.
        if unsafe { ACCOUNTED.take_reserved_raw_for(n as u64, crate::default_account()) } {
            return p.cast();
        }
    }
    // SAFETY: null or a new block of the heap's, made while ready.
    unsafe { finish_untagged::<INNER>(p) }
}

/// The general path's end of `malloc` without tags, as a function that
/// cannot unwind: reached by a jump.
///
/// # Safety
/// As [`untagged::finish`].
#[inline(never)]
unsafe extern "C" fn finish_untagged<const INNER: bool>(p: *mut u8) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { untagged::finish(p, heap::<INNER>(), crate::STATE_READY) }
}

/// # Safety
/// As `malloc(3)`.
#[inline(never)]
unsafe extern "C" fn malloc_tagged<const INNER: bool>(size: usize) -> *mut c_void {
    let heap = heap::<INNER>();
    let Some(total) = crate::with_header(size, HEADER) else {
        return crate::enomem();
    };
    // SAFETY: the heap's allocator; a block of `total` bytes, 16-aligned.
    let base = unsafe { heap.malloc(total) };
    if !base.is_null() {
        // SAFETY: a live block the heap just made for `total` bytes (at
        // least `HEADER`).
        let usable = unsafe { heap.usable_of_new(base, total) };
        let n = usable - HEADER;
        // SAFETY: the set-up claimed static TLS before turning this on.
        let account = unsafe { ACCOUNTED.take_reserved_raw(n as u64) };
        if !account.is_null() {
            // An inner heap's usable size goes in the header, for `free`
            // (glibc's is read from its size word without a call).
            let packed = if INNER { usable } else { 0 };
            // SAFETY: a new block of the heap's with room for the header,
            // of that usable size; the cookie was made before this path
            // was turned on.
            return unsafe { Block::write_made(base, account, heap, packed) }.cast();
        }
    }
    // SAFETY: null or a new block of the heap's, with room for the header.
    unsafe { finish_tagged::<INNER>(base) }
}

/// The general path's end of `malloc` with tags, as a function that
/// cannot unwind: reached by a jump.
///
/// # Safety
/// As [`crate::finish`] with a header.
#[inline(never)]
unsafe extern "C" fn finish_tagged<const INNER: bool>(base: *mut u8) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { crate::finish(base, crate::Place::Header, heap::<INNER>()) }
}

/// # Safety
/// As `free(3)`, `p` not null.
#[inline(never)]
unsafe extern "C" fn free_untagged<const INNER: bool>(p: *mut c_void) {
    let p = p.cast::<u8>();
    let heap = heap::<INNER>();
    if !untagged::may_be_early(p) {
        // SAFETY: a live block of the heap's, made when the accounting was
        // ready (any earlier one is remembered), so charged this much.
        if let Some(n) = unsafe { heap.usable_without_call(p) } {
            // SAFETY: the block held `n` bytes of `/preload`; static TLS
            // was claimed before this path was turned on.
            if unsafe { ACCOUNTED.give_reserved_raw(crate::default_account(), n as u64) } {
                // SAFETY: as above; not used again.
                return unsafe { heap.free(p) };
            }
        }
    }
    // SAFETY: as `free`; nothing was changed above.
    unsafe { free_untagged_general(p) }
}

/// [`untagged::free`] as a function that cannot unwind, reached by a jump
/// (not `untagged::free` itself: `free_general` inlines that).
///
/// # Safety
/// As `free(3)`, `p` not null.
#[inline(never)]
unsafe extern "C" fn free_untagged_general(p: *mut u8) {
    // SAFETY: forwarded.
    unsafe { untagged::free(p) }
}

/// # Safety
/// As `free(3)`, `p` not null.
#[inline(never)]
unsafe extern "C" fn free_tagged<const INNER: bool>(p: *mut c_void) {
    let p = p.cast::<u8>();
    let heap = heap::<INNER>();
    // SAFETY: a pointer the program got from an allocation function; the
    // cookie was made before this path was turned on.
    if let Some((account, packed)) = unsafe { header::header_account(p, heap) } {
        let usable = match packed {
            Some(usable) if INNER => Some(usable),
            // SAFETY: ours and live, its base `HEADER` bytes before `p`
            // (usable-size charging: what it was charged).
            _ => unsafe { heap.usable_without_call(p.sub(HEADER)) },
        };
        if let Some(usable) = usable {
            let n = usable - HEADER;
            // SAFETY: the block held `n` bytes of its account; static TLS
            // was claimed before this path was turned on.
            if unsafe { ACCOUNTED.give_reserved_raw(account, n as u64) } {
                // SAFETY: found by `header_account`; not used again.
                return unsafe { header::free_with_header(p, heap) };
            }
        }
    }
    // SAFETY: as `free`; nothing was changed above.
    unsafe { crate::free_general(p.cast()) }
}
